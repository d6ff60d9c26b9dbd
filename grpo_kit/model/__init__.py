"""The model: loading, the plain per-token log-probs, LoRA, sharding, precision; fast/ holds the speed-ups."""
