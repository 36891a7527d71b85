"""Harnesses for tests and benchmarks (development tool, not in any image): real server
processes on loopback (a vLLM OpenAI server, a moto S3 server), a free port, the one
wait-until loop, process-group and page-cache helpers. The test suite and scripts/bench_*.py
both import them from here.
"""
