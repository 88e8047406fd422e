"""Benchmarks: `python -m atlas.bench <name>`; each prints ratios measured side by side in one run."""
