"""The model: loading, per-token log-probs, LoRA, sharding, precision; fast/ holds the CPU speed-ups."""
