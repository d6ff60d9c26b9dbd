"""environment: the score the run's environment gives each completion, its `get_reward()` after the episode.

TRL's GRPOTrainer makes an environment that defines `get_reward` a reward source of its own; here it is one when
selected, `+environment=NAME +reward=environment`, and weighted and logged as any other reward. It reads the
`environments` keyword argument, which every reward receives in a run with an environment (one instance per
completion, as TRL hands them). `get_reward` takes no argument and returns a number, or None for no opinion; it
may be `async def`.
"""

import inspect

from grpo_kit import ConfigError, RewardError


class EnvironmentReward:
    required_columns = []  # it reads `environments`, which the run hands every reward when it has an environment

    def __init__(self, config):
        if config.environment is None:
            raise ConfigError(
                "+reward=environment scores with the environment's get_reward, and this run has no environment: "
                "select one with +environment=NAME."
            )
        self.name = config.environment

    async def __call__(self, prompts, completions, completion_ids, environments=None, **columns) -> list:
        if environments is None:
            raise RewardError("+reward=environment was called without `environments`: it scores environments only.")
        scores = []
        for environment in environments:
            if not callable(getattr(environment, "get_reward", None)):
                raise RewardError(
                    f"+reward=environment: the environment {self.name!r} ({type(environment).__name__}) has no "
                    "get_reward method. Give it one (no argument, returning a number), or choose another reward."
                )
            score = environment.get_reward()
            scores.append(await score if inspect.isawaitable(score) else score)
        return scores
