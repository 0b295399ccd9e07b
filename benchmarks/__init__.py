"""Ratio benchmarks (not part of the test run): `python -m benchmarks.core [--quick]`."""
