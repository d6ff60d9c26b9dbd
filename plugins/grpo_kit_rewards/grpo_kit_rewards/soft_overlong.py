"""soft_overlong: DAPO's soft overlong punishment, a penalty that ramps from 0 to -1 near the length limit.

DAPO, equation 13 (https://arxiv.org/abs/2503.14476), as TRL's `get_soft_overlong_punishment`
(https://huggingface.co/docs/trl/rewards) computes it from the completion's token count |y|, with
L = max_completion_len and C = soft_punish_cache:

    0                   if |y| <= L - C
    (L - C - |y|) / C   if L - C < |y| <= L
    -1                  if |y| > L
"""


class SoftOverlong:
    def __init__(self, config):
        length, cache = config.max_completion_len, config.soft_punish_cache
        if not isinstance(length, int) or length <= 0:
            raise ValueError(
                f"reward.soft_overlong.max_completion_len must be a positive number of tokens, got {length!r} "
                "(in a composed run it defaults to generation.max_completion_length)."
            )
        if cache is None or not 0 <= cache <= length:
            raise ValueError(
                f"reward.soft_overlong.soft_punish_cache must be set between 0 and max_completion_len={length}, got "
                f"{cache!r}: it is the length of the ramp before the limit (DAPO uses 4096 of 20480 tokens)."
            )
        self.max_completion_len, self.soft_punish_cache = length, cache

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float]:
        return [self._punishment(len(ids)) for ids in completion_ids]

    def _punishment(self, length: int) -> float:
        ramp_start = self.max_completion_len - self.soft_punish_cache
        if length <= ramp_start:
            return 0.0
        if length <= self.max_completion_len:
            return (ramp_start - length) / self.soft_punish_cache
        return -1.0
