"""Shared test infrastructure: real servers started once per session (vLLM, S3), demo
models, and the suite's one `free_port` (net.py) and one polling loop (waiting.py)."""
