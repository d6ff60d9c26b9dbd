"""Prompts: the dataset, this process's draws of them, and how a prompt becomes token ids."""

import functools
import json
from pathlib import Path

import datasets
from datasets.exceptions import DatasetGenerationError

from grpo_kit.config.schema import DataConfig
from grpo_kit.contract.errors import ConfigError, InputFileError, PluginError
from grpo_kit.embedded import sums as embedded

_FORMAT_OF_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


IMAGE_COLUMNS = ("image", "images")  # a prompt's images (rollout/images.py)


def load_prompts(cfg: DataConfig, setting: str = "data.path") -> datasets.Dataset:
    """The training prompts with their other columns, which reach the rewards as keyword arguments.

    `setting` is the option that named `cfg.path`, for the messages (eval.path for an eval set).
    """
    if cfg.path is None:
        dataset = datasets.Dataset.from_list(embedded.task(cfg.embedded, cfg.num_examples))
    else:
        path = Path(cfg.path).expanduser()
        if (path.suffix in _FORMAT_OF_SUFFIX or looks_local(cfg.path)) and not path.exists():
            raise InputFileError(
                f"{setting}={cfg.path} does not exist (looked for {path.absolute()}). Give an existing "
                f"{'/'.join(sorted(_FORMAT_OF_SUFFIX))} file or a folder of them, or a hub dataset id such as "
                "trl-lib/DeepMath-103K."
            )
        if path.suffix in _FORMAT_OF_SUFFIX:
            dataset = _anchored(_load_file(path, setting), path.parent)
        elif path.is_dir():
            dataset = _anchored(datasets.load_dataset(str(path), cfg.name, split=cfg.split), path)
        else:
            dataset = datasets.load_dataset(str(path), cfg.name, split=cfg.split)
    if len(dataset) == 0:
        raise ConfigError(f"The dataset {cfg.path} is empty: it needs at least one row with a `prompt`.")
    if "prompt" not in dataset.column_names:
        raise ConfigError(
            f"The dataset {cfg.path} has no `prompt` column (columns: {', '.join(dataset.column_names)}). "
            "Rename the column that holds the prompts to `prompt`."
        )
    check_prompts(dataset, f"{setting}={cfg.path}")
    return dataset


def check_prompts(dataset: datasets.Dataset, source: str) -> None:
    """Every prompt must be text or chat messages, and not empty: a bad row would otherwise fail only when a batch
    draws it, after checkpoints may have been written (an empty prompt has no token to predict the first from)."""
    for start in range(0, len(dataset), 1000):
        for offset, prompt in enumerate(dataset[start : start + 1000]["prompt"]):
            problem = prompt_problem(prompt)
            if problem:
                row = start + offset
                shown = str(dataset[row])  # the whole row, to find it by whatever count the user keeps
                raise ConfigError(
                    f"{source}: row {row + 1} (counting from 1), "
                    f"{shown[:100] + '...' * (len(shown) > 100)}, has a `prompt` that {problem}. Give every row a "
                    "non-empty prompt, as text or as a list of {role, content} messages, or drop the row."
                )


def prompt_problem(prompt) -> str | None:
    """What makes `prompt` no prompt, or None: a prompt is non-blank text or a non-empty list of chat messages.
    A column may mix the two, since each row is rendered on its own."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "is empty"
    if prompt is None:
        return "is missing (null, or an empty cell)"
    if isinstance(prompt, list) and not prompt:
        return "is an empty list of messages"
    if isinstance(prompt, list):
        return None if is_conversational(prompt) else "is a list, but not of chat messages (dicts with a `role`)"
    return f"is {prompt!r} ({type(prompt).__name__}), not text"


def _anchored(dataset: datasets.Dataset, folder: Path) -> datasets.Dataset:
    """A local dataset whose relative image paths are taken from its own folder, not from wherever the run starts."""
    columns = [name for name in IMAGE_COLUMNS if name in dataset.column_names]

    def anchor(value):
        if isinstance(value, str):
            return value if Path(value).expanduser().is_absolute() else str(folder / value)
        if isinstance(value, dict) and not value.get("bytes") and isinstance(value.get("path"), str):
            return value | {"path": anchor(value["path"])}  # a datasets Image feature, not decoded
        if isinstance(value, list):
            return [anchor(item) for item in value]
        return value

    return dataset.map(lambda row: {name: anchor(row[name]) for name in columns}) if columns else dataset


def looks_local(name_or_path: str) -> bool:
    """A path, not a hub id: hub ids are `name` or `owner/name`, and never start with '.', '/' or '~'."""
    return name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1


def _load_file(path: Path, setting: str) -> datasets.Dataset:
    file_format = _FORMAT_OF_SUFFIX[path.suffix]
    if file_format != "parquet" and not _utf8_text(path, setting).strip():
        return datasets.Dataset.from_dict({})  # datasets fails on an empty json file; load_prompts says it is empty
    try:
        return datasets.load_dataset(file_format, data_files=str(path), split="train")
    except DatasetGenerationError as error:
        # datasets chains three tracebacks to say "row 1"; the line and column are what the user needs.
        problem = (_json_syntax_error(path) if file_format == "json" else None) or str(error.__cause__ or error)
        raise InputFileError(
            f"{setting}={path} could not be read: {problem}. Correct the file (or drop the broken row) and run again."
        ) from None
    except ValueError as error:
        if "no data" not in str(error):
            raise
        return datasets.Dataset.from_dict({})  # an empty file; load_prompts says so


def _utf8_text(path: Path, setting: str) -> str:
    """The text of a json or csv file, refused with the place of its first byte that is not UTF-8: datasets would
    read such bytes into a row that fails only when a batch draws it."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - data.rfind(b"\n", 0, error.start)  # rfind is -1 on the first line
        raise InputFileError(
            f"{setting}={path} is not UTF-8 text: line {line} has the byte {data[error.start]:#04x} at column "
            f"{column}. Save the file as UTF-8 (from Latin-1: "
            f"iconv -f latin1 -t utf-8 {path.name}), or correct that line, and run again."
        ) from None


def _json_syntax_error(path: Path) -> str | None:
    """Where a json or jsonl file first breaks JSON's syntax ("line 3 is not valid JSON (...)"), or None."""
    text = path.read_text()
    try:
        json.loads(text)
        return None
    except json.JSONDecodeError as error:
        if error.msg != "Extra data":  # one JSON document (an array of rows, say), broken at this place
            return f"line {error.lineno} is not valid JSON ({error.msg} at column {error.colno})"
    for number, line in enumerate(text.splitlines(), start=1):  # JSON lines: one row per line
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as error:
            return f"line {number} is not valid JSON ({error.msg} at column {error.colno})"
    return None


class PromptSampler:
    """This process's share of the run's prompt draws, which the sampler plugin decides (`+sampler=NAME`; uniform:
    shuffled passes, reproducibly from the seed).

    Every process's sampler makes the same draws and is told the same groups' rewards, so all decide alike; each
    process keeps its share of a draw, so that the processes together see each drawn prompt once.
    """

    def __init__(self, dataset: datasets.Dataset, sampler, seed: int, shuffle: bool, process_index=0, num_processes=1):
        self.dataset, self.sampler = dataset, sampler
        self.process_index, self.num_processes = process_index, num_processes
        sampler.start(dataset, seed, shuffle)

    def draw(self, count: int) -> list[dict]:
        """This process's next `count` rows."""
        return self.draw_indexed(count)[1]

    def draw_indexed(self, count: int) -> tuple[list[int], list[dict]]:
        """This process's next `count` rows, and their indices in the dataset."""
        every = self.sampler.draw(count * self.num_processes)
        if len(every) != count * self.num_processes or not all(0 <= index < len(self.dataset) for index in every):
            raise PluginError(
                f"The sampler {type(self.sampler).__name__} drew {every!r} for {count * self.num_processes} prompts: "
                f"it must return that many indices of the {len(self.dataset)} training prompts."
            )
        mine = [int(index) for index in every[self.process_index :: self.num_processes]]
        return mine, [self.dataset[index] for index in mine]

    def observe(self, indices: list[int], rewards) -> None:
        """Every process's scored groups: their prompts' indices and (G, num_generations) rewards."""
        self.sampler.observe(indices, rewards)

    def metrics(self) -> dict[str, float]:
        return {f"sampler/{name}": float(value) for name, value in self.sampler.metrics().items()}

    def state(self) -> dict:
        return self.sampler.state_dict()

    def restore(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


def is_conversational(prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(message, dict) and "role" in message for message in prompt)


def use_chat_template_kwargs(tokenizer, chat_template_kwargs) -> None:
    """Hand data.chat_template_kwargs to every chat template the policy's tokenizer renders: training and eval
    prompts, the tool loop's turns, a rollout plugin's own calls (TRL passes them to each of its calls)."""
    if chat_template_kwargs:
        tokenizer.apply_chat_template = functools.partial(tokenizer.apply_chat_template, **chat_template_kwargs)


def prompt_text(tokenizer, prompt) -> str:
    """Chat-message prompts go through the tokenizer's chat template; text prompts are used as they are."""
    if is_conversational(prompt):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return prompt
