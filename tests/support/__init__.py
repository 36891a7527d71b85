"""Shared test infrastructure: real servers started once per session."""
