"""gpg: Group Policy Gradient's loss, the plain policy gradient -A * log pi_theta: no ratio, no clip, no KL.

GPG (Chu et al. 2025), "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
https://arxiv.org/abs/2504.02546. GPG optimises the reinforcement-learning objective itself rather than PPO's
surrogate. Over the completions o_1..o_N of a batch:

    loss = -(1 / sum_i |o_i|) * sum_i sum_t A_i * log pi_theta(o_i,t | q, o_i,<t)

a mean over every token of the batch, so each token weighs the same whatever the length of its completion. (The
authors' code divides by the tokens of each micro-batch; with one micro-batch per optimizer step, as in the
embedded default, the two agree, and only the batch-wide mean is independent of how a batch is split.)

With no importance ratio the gradient is the on-policy policy gradient: train each batch once, in one optimizer
step (algorithm.num_iterations=1 and steps_per_generation unset, the defaults). The importance-sampling plugin's
weights are not used, so its level does not matter (`grpo_kit.Loss`'s default, as every other default suits it).
The paper's advantage and its correction factor alpha are the `gpg` advantage estimator (gpg_advantage.py):
`+loss=gpg advantage=gpg`.
"""

import grpo_kit
from grpo_kit.contract.reductions import global_token_mean, masked_mean


class GPG(grpo_kit.Loss):
    def per_token_loss(self, inputs):
        per_token_loss = -inputs.advantages * inputs.per_token_logps  # (B, T)
        # The completions that teach something: the authors log the share of these in a batch (1 / alpha).
        nonzero = (inputs.advantages != 0).float().expand_as(inputs.mask)
        return per_token_loss, {"gpg/nonzero_advantage_share": masked_mean(nonzero, inputs.mask)}

    def reduce(self, per_token_loss, mask, reduction):
        # Sum over the active tokens / the active tokens of one optimizer step's share of the generation batch:
        # 1 / sum_i |o_i| over the whole batch, with gradient accumulation and processes taken into account.
        return global_token_mean(per_token_loss, mask, reduction)
