"""MiniStream load tests: SLO reports and the rolling-restart experiment.

The load itself is generated and measured by `vllm bench serve` (engine.py); this package
chooses workloads (scenarios.py), reads the engine's results (records.py, slo.py), plots them
(plots.py) and runs the rolling-restart experiment (rollout.py with fleet.py and haproxy.py).
"""
