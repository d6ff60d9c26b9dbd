"""token: one importance weight per token, pi_theta / pi_old of that token (PPO, GRPO).

Schulman et al. 2017, https://arxiv.org/abs/1707.06347; DeepSeekMath eq. 3, https://arxiv.org/abs/2402.03300.
"""


class TokenLevel:
    def log_weights(self, log_ratio, mask):
        return log_ratio  # (B, T)
