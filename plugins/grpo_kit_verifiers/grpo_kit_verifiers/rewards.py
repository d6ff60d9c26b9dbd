"""verifiers: the rubric's score of each episode that +rollout=verifiers played, as a grpo_kit reward.

The rollout hands every reward the scores verifiers recorded on each trace (rollout.py). This reward returns the
weighted total that verifiers itself trains on (`Trace.reward`, the sum of each `@vf.reward` function's score
times its weight), or, with `reward.verifiers.function=NAME`, that one function's score, which a run may then
weigh against grpo_kit's own rewards.
"""

from grpo_kit.contract.errors import RewardError
from grpo_kit_verifiers.configs import VerifiersRewardConfig


class VerifiersReward:
    required_columns = []  # its columns come from +rollout=verifiers, not from the dataset

    def __init__(self, config: VerifiersRewardConfig):
        self.function = config.function

    def __call__(self, prompts, completions, completion_ids, verifiers_reward=None, verifiers_scores=None, **columns):
        if verifiers_reward is None or verifiers_scores is None:
            raise RewardError(
                "+reward=verifiers scores verifiers episodes, and this batch has none: generate with "
                "+rollout=verifiers."
            )
        if self.function is None:
            return list(verifiers_reward)
        unknown = [scores for scores in verifiers_scores if self.function not in scores]
        if unknown:
            raise RewardError(
                f"reward.verifiers.function={self.function}: the taskset has no reward function of that name "
                f"(its functions: {', '.join(sorted(unknown[0])) or 'none'})."
            )
        return [scores[self.function] for scores in verifiers_scores]
