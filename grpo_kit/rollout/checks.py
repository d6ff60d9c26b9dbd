"""Checks on the run's inputs, made before any training, each failing with what is wrong and how to fix it."""

import inspect
from pathlib import Path

import datasets

from grpo_kit.contract.errors import ConfigError, InputFileError
from grpo_kit.contract.kinds import declared
from grpo_kit.rollout.prompts import is_conversational, looks_local, prompt_text

TRL_ARGUMENTS = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


def check_model_path(name_or_path: str | None) -> None:
    """A local-looking path must be a saved model: say what is wrong with it before transformers guesses."""
    if name_or_path is None:
        return
    path = Path(name_or_path).expanduser()
    if not path.exists():
        if looks_local(name_or_path):  # a typo, not a hub id: say so before the hub is asked
            raise InputFileError(
                f"model.name_or_path={name_or_path} does not exist. Give an existing folder saved with "
                "save_pretrained, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct."
            )
        return
    # A LoRA run's model/ holds its adapters (adapter_config.json), which transformers loads onto their base model.
    if not path.is_dir() or not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise InputFileError(
            f"model.name_or_path={name_or_path} is not a saved model: {path.absolute()} is not a folder with a "
            "config.json. Give the folder that save_pretrained wrote (config.json, the weights and the tokenizer "
            "files), or a hub id such as Qwen/Qwen2.5-0.5B-Instruct."
        )


def check_reward_columns(rewards: dict, dataset: datasets.Dataset, options: dict | None = None) -> None:
    """Every column a reward requires must be in the dataset (other columns reach rewards as keyword arguments).

    `options` holds each reward's options by its key: one whose value is a missing column's name is the option that
    chose that column (reward.accuracy.solution_column), which the message names.
    """
    available = set(dataset.column_names) - {"prompt"}
    for name, reward in rewards.items():
        missing = sorted(set(required_columns(reward)) - available)
        if missing:
            settings = [
                f"reward.{name}.{option}" for option, value in (options or {}).get(name, {}).items() if value in missing
            ]
            fix = f"Set {' or '.join(settings)} to the column that holds it, add" if settings else "Add"
            raise ConfigError(
                f"Reward {name!r} needs the dataset column(s) {', '.join(missing)}, which the dataset lacks (its "
                f"columns: {', '.join(dataset.column_names)}). {fix} the column, or choose another reward."
            )


def required_columns(reward) -> list[str]:
    """What a reward declares (`required_columns`), or the keyword parameters without defaults it takes."""
    columns = declared(reward, "reward", "required_columns")
    if columns is not None:
        return list(columns)
    function = getattr(reward, "function", reward)  # a reward bound to its options keeps the function
    parameters = inspect.signature(function).parameters.values()
    bound = getattr(reward, "options", None) or getattr(reward, "kwargs", None) or {}
    return [
        p.name
        for p in parameters
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in TRL_ARGUMENTS
        and p.name not in bound
    ]


def check_prompt_lengths(dataset: datasets.Dataset, tokenizer, max_completion_length: int, context: int | None):
    """Chat prompts need a chat template, and the longest prompt plus a full completion must fit the context."""
    if tokenizer.chat_template is None:
        check_no_chat_prompts(dataset)
    if context is None:
        return
    longest, index = 0, 0
    for start in range(0, len(dataset), 1000):
        prompts = dataset[start : start + 1000]["prompt"]
        texts = [prompt_text(tokenizer, prompt) for prompt in prompts]
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids]
        if max(lengths) > longest:
            longest, index = max(lengths), start + lengths.index(max(lengths))
    if longest + max_completion_length > context:
        raise ConfigError(
            f"Prompt {index} of the dataset is {longest} tokens long; with generation.max_completion_length="
            f"{max_completion_length} that exceeds the model's context of {context} tokens. Shorten or drop the "
            "long prompts, or lower generation.max_completion_length."
        )


def check_no_chat_prompts(dataset: datasets.Dataset) -> None:
    """For a tokenizer without a chat template, which transformers refuses to render chat messages with."""
    for start in range(0, len(dataset), 1000):
        for offset, prompt in enumerate(dataset[start : start + 1000]["prompt"]):
            if is_conversational(prompt):
                raise ConfigError(
                    f"Row {start + offset + 1} of the dataset (counting from 1) is a list of chat messages, but the "
                    "model's tokenizer has no chat template to render them with. Give text prompts, or a model "
                    "whose tokenizer has a chat template (an instruction-tuned one)."
                )
