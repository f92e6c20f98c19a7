"""Load generators and their stand-in servers; every tool prints one JSON line of results on stdout.

Run them as modules from the repository root (`python -m benchmarks.bench_writer ...`); see README.md.
"""
