"""Grafana dashboards, Prometheus alert rules and autoscaling queries for MiniStream,
generated from code.

`python -m ministream_observability generate` writes charts/ministream/dashboards/*.json,
charts/ministream/rules/ministream-alerts.yaml, charts/ministream/autoscaling/*.yaml and the
query list of docs/observability.md; `--check` fails when any of them is out of date. Nothing
here runs at import time.
"""
