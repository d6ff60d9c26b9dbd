"""A recipe's rewards as grpo_kit's: TRL's grpo script and open-r1 name their reward functions in `reward_funcs`
(and a reward model in `reward_model_name_or_path`), weighted by `reward_weights` in that order: the reward model
first, then the functions, as TRL's script lists them.

The override `reward` holds {key: plugin}: `+reward=[a,b]` where each key is its plugin's name, and
`+reward@reward.KEY=python` for a function named by its import path.
"""

from grpo_kit.config.trl_entries import Refusal

# A reward function's name in TRL's grpo script or in open-r1 -> grpo_kit's reward plugin.
REWARDS = {
    "accuracy_reward": "accuracy",  # TRL
    "reasoning_accuracy_reward": "reasoning_accuracy",
    "think_format_reward": "think_format",
    "get_soft_overlong_punishment": "soft_overlong",
    "accuracy": "accuracy",  # open-r1
    "cosine": "cosine_scaled",
    "repetition_penalty": "repetition_penalty",
    "soft_overlong_punishment": "soft_overlong",
}
# TRL's grpo script builds its soft overlong punishment with these, where open-r1 reads them from the recipe.
TRL_SOFT_OVERLONG = {"max_completion_len": 1280, "soft_punish_cache": 256}
NEAREST_REWARD = "+reward@reward.KEY=python reward.KEY.function=module:function (docs/rewards.md)"


def reward_keys(recipe: dict) -> dict[str, str]:
    """{key: plugin} in TRL's order; refuses a reward function grpo_kit has no plugin for."""
    keys = {"reward_model": "reward_model"} if recipe.get("reward_model_name_or_path") else {}
    for name in recipe.get("reward_funcs") or []:
        if name in REWARDS:
            keys[REWARDS[name]] = REWARDS[name]
        elif "." in name and name not in REWARDS:  # TRL's script imports a dotted path
            module, function = name.rsplit(".", 1)
            keys[function] = f"python:{module}:{function}"
        else:
            raise Refusal(f"no grpo_kit reward does what the reward function {name!r} does", NEAREST_REWARD)
    return keys


def rewards(value, recipe: dict) -> dict:
    """The reward choice and each reward's options; the same whichever of its fields asks."""
    keys = reward_keys(recipe)
    overrides: dict = {"reward": {key: plugin.split(":")[0] for key, plugin in keys.items()}}
    for key, plugin in keys.items():
        if plugin.startswith("python:"):
            overrides[f"reward.{key}.function"] = plugin.removeprefix("python:")
    if "reward_model" in keys:
        overrides["reward.reward_model.path"] = recipe["reward_model_name_or_path"]
    if "soft_overlong" in keys and "get_soft_overlong_punishment" in (recipe.get("reward_funcs") or []):
        overrides |= {f"reward.soft_overlong.{name}": value for name, value in TRL_SOFT_OVERLONG.items()}
    if "repetition_penalty" in keys:  # open-r1 counts n-grams of lower-cased words, TRL's rewards of tokens
        overrides["reward.repetition_penalty.unit"] = "words"
    return overrides


def reward_weights(value, recipe: dict) -> dict:
    keys = list(reward_keys(recipe))
    if value is None:
        return {}
    if len(value) != len(keys):
        raise Refusal(f"{len(value)} weights for {len(keys)} rewards", "reward.NAME.weight")
    return {f"reward.{key}.weight": float(weight) for key, weight in zip(keys, value)}


def reward_option(plugin: str, option: str):
    """An open-r1 option of one reward function, which it reads only when that function is chosen."""

    def translate(value, recipe: dict) -> dict:
        return {f"reward.{plugin}.{option}": value} if plugin in reward_keys(recipe) else {}

    return translate
