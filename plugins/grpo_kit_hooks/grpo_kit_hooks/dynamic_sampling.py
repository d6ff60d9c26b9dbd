"""dynamic_sampling: replace the groups whose rewards are all equal with groups that can teach something.

DAPO (Yu et al. 2025), https://arxiv.org/abs/2503.14476, section 3.2 "Dynamic Sampling": a group whose
completions all get the same reward has zero advantage everywhere and no gradient, so keep generating and
scoring more prompts until the batch is full of groups with some spread. `max_draws` caps the extra rounds; if
they run out, the batch is filled up with the zero-spread groups it already had, so its size never changes.
"""

import grpo_kit
from grpo_kit_hooks.configs import DynamicSamplingConfig


class DynamicSampling:
    def __init__(self, config: DynamicSamplingConfig):
        self.max_draws, self.min_std = config.max_draws, config.min_std

    @grpo_kit.hookimpl
    def on_rollout_scored(self, run, scored, draw):
        needed = scored.num_groups
        kept = scored.select_groups(self._spread(scored))
        draws = drawn_groups = 0
        while kept.num_groups < needed and draws < self.max_draws:
            more = draw(needed)
            draws, drawn_groups = draws + 1, drawn_groups + more.num_groups
            kept = kept.concat(more.select_groups(self._spread(more)))
        if kept.num_groups < needed:  # out of draws: top up with groups that have no spread
            flat = [g for g in range(scored.num_groups) if g not in set(self._spread(scored))]
            kept = kept.concat(scored.select_groups(flat[: needed - kept.num_groups]))
        kept = kept.select_groups(list(range(needed)))
        kept.metrics["dynamic_sampling/draws"] = float(draws)
        kept.metrics["dynamic_sampling/drawn_groups"] = float(drawn_groups)
        kept.metrics["dynamic_sampling/zero_std_before"] = float((scored.group_std() <= self.min_std).float().mean())
        return kept

    def _spread(self, scored) -> list[int]:
        return (scored.group_std() > self.min_std).nonzero().view(-1).tolist()
