"""walsink benchmarks; run them all with ``python -m bench.run`` (see bench/README.md)."""
