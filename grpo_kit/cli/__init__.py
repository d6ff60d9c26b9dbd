"""The command line: `python -m grpo_kit` (Hydra) and `grpo-kit` (plugins, report)."""
