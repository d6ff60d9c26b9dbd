"""The built-in rewards' options: each field is a `reward.NAME.FIELD=...` option, with its default.

The options live here, apart from the rewards, so that a worker process running a reward never imports the core.
`${generation.max_completion_length}` defaults resolve against the composed run's config.
"""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from grpo_kit import RewardConfig


@dataclass
class AccuracyConfig(RewardConfig):
    solution_column: str = "solution"  # the dataset column holding the gold answers


@dataclass
class ReasoningAccuracyConfig(AccuracyConfig):
    # The answer is what follows the first of these found in the completion.
    reasoning_delimiters: list[str] = field(default_factory=lambda: ["</think>"])


@dataclass
class CosineScaledConfig(AccuracyConfig):
    max_len: int = II("generation.max_completion_length")  # tokens at which the schedule reaches its far end
    min_value_wrong: float = -1.0  # a wrong answer at length 0
    max_value_wrong: float = -0.5  # a wrong answer at max_len
    min_value_correct: float = 0.5  # a right answer at max_len
    max_value_correct: float = 1.0  # a right answer at length 0


@dataclass
class RepetitionPenaltyConfig(RewardConfig):
    ngram_size: int = 3  # units per n-gram; a completion with fewer units scores 0.0
    max_penalty: float = -1.0  # the reward of a completion that is one n-gram repeated
    unit: str = "tokens"  # n-grams of "tokens" (TRL) or of lower-cased "words" (open-r1)


@dataclass
class SoftOverlongConfig(RewardConfig):
    max_completion_len: int = II("generation.max_completion_length")  # tokens past which the penalty is -1
    soft_punish_cache: int | None = None  # tokens before max_completion_len where the penalty ramps; required


@dataclass
class PythonFunctionConfig(RewardConfig):
    function: str | None = None  # "package.module:function"; required. Several: +reward@reward.KEY=python each
    # Dicts typed Any so that free keys can be given: reward.python.kwargs={target:3}
    kwargs: Any = None  # added to every call
    factory_kwargs: Any = None  # set: `function` is a factory, called once with these to make the reward
    cpu_heavy: bool | None = None  # run in worker processes; None: as the function declares (`cpu_heavy = True`)


@dataclass
class RewardModelConfig(RewardConfig):
    path: str | None = None  # a Hugging Face model id or local folder (AutoModelForSequenceClassification); required
    batch_size: int = 8  # texts scored per forward pass
    device: str = "auto"  # "auto": cuda when there is one, else cpu
    max_length: int | None = None  # tokens per text; None: no truncation
    dtype: str = "auto"  # the model's torch dtype (bfloat16, float32, ...); "auto": the checkpoint's
    # Run the reward model's own code from the hub: as model.trust_remote_code in a run, false outside one.
    trust_remote_code: bool = II("oc.select:model.trust_remote_code,false")
