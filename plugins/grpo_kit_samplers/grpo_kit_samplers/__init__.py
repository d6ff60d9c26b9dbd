"""grpo_kit's built-in prompt samplers (`+sampler=NAME`): which dataset rows make each generation batch."""
