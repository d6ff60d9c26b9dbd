"""none: the sampler is taken to be the trainer's policy, so no rollout correction is applied."""


class NoCorrection:
    def ratio(self, old_per_token_logps, sampling_per_token_logps, mask):
        return None
