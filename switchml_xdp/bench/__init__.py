"""Benchmarks: scripts that print figures and ratios (run with python -m)."""
