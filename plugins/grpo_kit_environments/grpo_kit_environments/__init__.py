"""grpo_kit's built-in environments for multi-turn tool use."""
