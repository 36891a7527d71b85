"""Grafana dashboards and Prometheus alert rules for MiniStream, generated from code.

`python -m ministream_observability generate` writes charts/ministream/dashboards/*.json,
charts/ministream/rules/ministream-alerts.yaml and the query list of docs/observability.md;
`--check` fails when any of them is out of date. Nothing here runs at import time.
"""
