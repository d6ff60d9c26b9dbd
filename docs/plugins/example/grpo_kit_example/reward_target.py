"""reward_target: a hook plugin that notes the step at which the logged reward first reaches a target.

The note goes into the run directory, so that a sweep can be read for "steps to reach 0.5" without scanning every
metrics file."""

import json

import grpo_kit
from grpo_kit_example.configs import RewardTargetConfig


class RewardTarget:
    def __init__(self, config: RewardTargetConfig):
        self.target = config.target
        self.reached_at: int | None = None

    @grpo_kit.hookimpl
    def on_log(self, run, step, metrics):
        # .get: a line may lack the reward (the eval-only line of step 0)
        if self.reached_at is None and metrics.get("reward", float("-inf")) >= self.target:
            self.reached_at = step

    @grpo_kit.hookimpl
    def on_train_end(self, run):
        note = {"target": self.target, "reached_at_step": self.reached_at}
        (run.directory / "reward_target.json").write_text(json.dumps(note) + "\n")
