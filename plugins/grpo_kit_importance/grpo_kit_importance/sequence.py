"""sequence: one importance weight per sequence, the geometric mean of its token ratios (GSPO).

GSPO, Group Sequence Policy Optimization (Zheng et al. 2025), https://arxiv.org/abs/2507.18071, eq. 7:
s_i = (pi_theta(y_i|x) / pi_old(y_i|x)) ** (1 / |y_i|), i.e. the mean of the token log-ratios, exponentiated.
"""


class SequenceLevel:
    def log_weights(self, log_ratio, mask):
        return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)  # (B, 1)
