"""The latest generation batch's completions as a table at each logging step (trainer.log_completions), as TRL
logs them: a wandb Table, a trackio Table, a tensorboard text (a markdown table), and a compact rich table on the
console. One row per completion: step, prompt, completion, each reward, advantage.

Like TRL, the table holds the last generation batch of every process (gathered), not every batch since the last
log: with logging_steps=10 it shows the tenth step's completions. samples.jsonl (grpo_kit/outputs/samples.py) is
the record of every sampled step; these tables are for reading a run while it trains.
"""

import math

import torch
from accelerate.utils import gather_object
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from grpo_kit.contract.hookspecs import hookimpl
from grpo_kit.outputs.samples import as_text

TABLE = "completions"  # the table's name in every tracker


class CompletionTables:
    """Remembers each generation batch's rows (`remember`, on every process) and hands them to the trackers and the
    console at the next logging step (the `on_log` hook, on the main process)."""

    def __init__(self, accelerator, rows_to_print: int | None, unique_prompts: bool = False, console=None):
        self.accelerator = accelerator
        self.rows_to_print = rows_to_print  # None: every row
        self.unique_prompts = unique_prompts  # one row per prompt: its group's first completion (TRL's)
        self.console = console or Console()
        self.rows: list[dict] = []

    def remember(
        self,
        step: int,
        prompts: list,
        completions: list,
        rewards_per_func: torch.Tensor,  # (N, K), NaN where a reward had no opinion
        reward_names: list[str],
        advantages: torch.Tensor,  # (N,)
    ) -> None:
        rows = [
            {"step": step, "prompt": as_text(prompt), "completion": as_text(completion)}
            | {name: _number(value) for name, value in zip(reward_names, rewards)}
            | {"advantage": _number(advantage)}
            for prompt, completion, rewards, advantage in zip(
                prompts, completions, rewards_per_func.tolist(), advantages.tolist()
            )
        ]
        if self.accelerator.num_processes > 1:
            rows = gather_object(rows)  # every process calls it: each holds its own prompts' completions
        if self.unique_prompts:
            rows = list({row["prompt"]: row for row in reversed(rows)}.values())[::-1]
        self.rows = rows

    @hookimpl
    def on_log(self, run, step, metrics):
        if not self.rows or not self.accelerator.is_main_process:
            return
        columns = list(self.rows[0])
        data = [[row[column] for column in columns] for row in self.rows]
        for tracker in self.accelerator.trackers:
            log_table(tracker, columns, data, step)
        shown = self.rows if self.rows_to_print is None else self.rows[: self.rows_to_print]
        if shown:
            with tqdm.external_write_mode():  # above the progress bar, not through it
                self.console.print(console_table(shown, step))
        self.rows = []  # a logging step without a new generation batch repeats nothing


def log_table(tracker, columns: list[str], data: list[list], step: int) -> None:
    """One table into one of accelerate's trackers, each in its own kind of table."""
    if tracker.name == "wandb":
        tracker.log_table(TABLE, columns=columns, data=data, step=step)
    elif tracker.name == "trackio":
        import trackio  # installed when the run reports to trackio (grpo_kit/outputs/trackers.py checks)

        tracker.log({TABLE: trackio.Table(columns=columns, data=data)}, step=step)
    elif tracker.name == "tensorboard":
        tracker.writer.add_text(TABLE, markdown_table(columns, data), global_step=step)


def markdown_table(columns: list[str], data: list[list]) -> str:
    """What tensorboard's text tab renders as a table."""
    lines = [_markdown_row(columns), "|" + "---|" * len(columns)]
    return "\n".join(lines + [_markdown_row(row) for row in data])


def console_table(rows: list[dict], step: int) -> Table:
    table = Table(title=f"completions at step {step}", show_lines=True, expand=False)
    for column in rows[0]:
        if column != "step":
            numeric = column not in ("prompt", "completion")
            table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_cell(value) for name, value in row.items() if name != "step"))
    return table


def _markdown_row(cells: list) -> str:
    # A pipe would end the cell and a newline the row: both are escaped so that a completion stays one cell.
    return "| " + " | ".join(_cell(cell).replace("|", "\\|").replace("\n", "<br>") for cell in cells) + " |"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "None" if value is None else str(value)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value  # no opinion, as samples.jsonl writes it
