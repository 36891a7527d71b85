"""Test oracles for MiniStream: the plain-PyTorch reference model and the golden comparisons.

A development tool, not part of the serving images (docs/packaging.md): `model` is the
reference implementation every other path is checked against, `golden` runs it and vLLM on
the same prompts and compares them with vLLM's `check_logprobs_close` semantics.
"""
