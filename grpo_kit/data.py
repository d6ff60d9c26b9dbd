"""Prompts: the dataset, the order they are drawn in, and how a prompt becomes token ids."""

import random
from pathlib import Path

import datasets

from grpo_kit import embedded
from grpo_kit.config import DataConfig

_FORMAT_OF_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_prompts(cfg: DataConfig) -> datasets.Dataset:
    """The training prompts with their other columns, which reach the rewards as keyword arguments."""
    if cfg.path is None:
        dataset = datasets.Dataset.from_list(embedded.build_task(cfg.num_examples))
    elif Path(cfg.path).suffix in _FORMAT_OF_SUFFIX:
        if not Path(cfg.path).exists():
            raise FileNotFoundError(f"data.path={cfg.path} does not exist.")
        try:
            dataset = datasets.load_dataset(_FORMAT_OF_SUFFIX[Path(cfg.path).suffix], data_files=cfg.path, split="train")
        except ValueError as error:
            if "no data" not in str(error):
                raise
            dataset = datasets.Dataset.from_dict({})  # an empty file; check_dataset says so
    else:
        dataset = datasets.load_dataset(cfg.path, cfg.name, split=cfg.split)
    if len(dataset) == 0:
        raise ValueError(f"The dataset {cfg.path} is empty: it needs at least one row with a `prompt`.")
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"The dataset {cfg.path} has no `prompt` column (columns: {', '.join(dataset.column_names)}). "
            "Rename the column that holds the prompts to `prompt`."
        )
    return dataset


class PromptSampler:
    """Draws prompts without replacement, one shuffled pass after another, reproducibly from the seed.

    Every process draws the same rows and keeps its own share, so the processes together see each row once.
    """

    def __init__(self, dataset: datasets.Dataset, seed: int, shuffle: bool = True, process_index=0, num_processes=1):
        self.dataset, self.shuffle = dataset, shuffle
        self.process_index, self.num_processes = process_index, num_processes
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def draw(self, count: int) -> list[dict]:
        """This process's share of the next `count` rows."""
        rows = []
        while len(rows) < count:
            if not self.order:
                self.order = list(range(len(self.dataset)))
                if self.shuffle:
                    self.rng.shuffle(self.order)
            rows.append(self.dataset[self.order.pop()])
        return rows[self.process_index :: self.num_processes]

    def state(self) -> dict:
        return {"rng": self.rng.getstate(), "order": list(self.order)}

    def restore(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])


def is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(message, dict) and "role" in message for message in prompt)


def prompt_text(tokenizer, prompt) -> str:
    """Chat-message prompts go through the tokenizer's chat template; text prompts are used as they are."""
    if is_conversational(prompt):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return prompt
