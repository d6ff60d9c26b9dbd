"""grpo_kit plugins that train on verifiers environments (the `verifiers` package, 0.4): +rollout=verifiers plays
a taskset's tasks as verifiers episodes through grpo_kit's generation backend, +reward=verifiers scores them with
the taskset's own reward functions. docs/plugins/verifiers.md is the guide."""
