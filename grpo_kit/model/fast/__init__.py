"""Speed-ups beside the plain path (model/logprobs.py), one module each, each switchable (switches.py): what each
speeds up, where it applies and its switch are in its docstring and docs/training.md; its figures in
benchmarks/README.md."""
