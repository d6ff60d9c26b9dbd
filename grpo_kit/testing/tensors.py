"""Builders for a loss plugin's inputs in tests."""

import torch

from grpo_kit.contract.kinds import LossInputs, Reduction


def loss_inputs(log_weights, advantages, mask, per_token_logps=None, log_ratio=None, rollout_ratio=None) -> LossInputs:
    """LossInputs with zeros for the log-probs and log_weights as the log-ratio unless given."""
    per_token_logps = torch.zeros(mask.shape) if per_token_logps is None else per_token_logps
    log_ratio = log_weights if log_ratio is None else log_ratio
    return LossInputs(log_weights, log_ratio, advantages, per_token_logps, mask, rollout_ratio)


def reduction(num_items_in_batch, accumulation=1, steps_per_generation=None, processes=1, max_length=4) -> Reduction:
    """A Reduction; steps_per_generation defaults to the accumulation steps, as in a run."""
    return Reduction(num_items_in_batch, accumulation, steps_per_generation or accumulation, processes, max_length)
