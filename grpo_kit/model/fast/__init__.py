"""CPU speed-ups beside the plain path, each switchable (docs/training.md, benchmarks/README.md)."""
