"""Benchmarks of drumbeat (``python -m bench.core``); not part of the installed package."""
