"""Samples of what the policy writes, every few steps: samples.jsonl (all of them) and samples.html (the latest).

Each recorded step adds the first `max_rows` completions of its generation batch, so whole groups of one prompt
stand side by side, with each reward and the advantage they earned, and (when the generation backend's tensors are
handed over) each completion's length in tokens and whether max_completion_length cut it off. Columns the rewards
logged with TRL's `log_extra` are under `extra` (a column each on the page, between the rewards and the advantage).
"""

import html
import itertools
import json
import math
import os
from collections import deque
from pathlib import Path

import torch

from grpo_kit.contract.kinds import Completions

PAGE_STEPS = 20  # recorded steps the page shows, newest first


class SampleLog:
    def __init__(self, run_dir: Path, every: int, max_rows: int):
        if every < 1 or max_rows < 1:
            raise ValueError(f"SampleLog needs every >= 1 and max_rows >= 1, got every={every}, max_rows={max_rows}.")
        self.jsonl_path, self.html_path = Path(run_dir) / "samples.jsonl", Path(run_dir) / "samples.html"
        self.every, self.max_rows = every, max_rows
        self.recent: deque[list[dict]] = deque(maxlen=PAGE_STEPS)

    def record(
        self,
        step: int,
        prompts: list,
        completions: list,
        rewards_per_func: torch.Tensor,  # (N, K), NaN where a reward had no opinion
        reward_names: list[str],
        advantages: torch.Tensor,  # (N,)
        generated: Completions | None = None,  # the same N completions as tensors: their lengths and truncation
        extra_columns: dict[str, list] | None = None,  # (N,) each: what the rewards logged with log_extra
    ) -> None:
        if step % self.every:
            return
        shown = slice(self.max_rows)
        rows = [
            {"step": step, "prompt": prompt, "completion": completion}
            for prompt, completion in zip(prompts[shown], completions[shown])
        ]
        if generated is not None:
            # Every token of the completion, tool results included: max_completion_length counts them all, so this
            # is the length to read next to `truncated`.
            lengths = generated.completion_mask[shown].sum(dim=1).tolist()
            for row, length, truncated in zip(rows, lengths, generated.is_truncated[shown].tolist()):
                row |= {"completion_tokens": int(length), "truncated": bool(truncated)}
        for row, rewards, advantage in zip(rows, rewards_per_func[shown].tolist(), advantages[shown].tolist()):
            row |= {
                "rewards": {name: _number(value) for name, value in zip(reward_names, rewards)},
                "advantage": _number(advantage),
            }
        for index, row in enumerate(rows):
            if extra_columns:
                row["extra"] = {name: values[index] for name, values in extra_columns.items()}
        with self.jsonl_path.open("a", encoding="utf-8") as file:
            # default=str: a logged value JSON has no type for (a numpy number, a Path) is written as its text
            file.writelines(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)
        self.recent.appendleft(rows)
        # Written aside and moved into place, so a browser refreshing the page never reads half of it.
        staging = self.html_path.with_suffix(".html.tmp")
        staging.write_text(_page(self.recent), encoding="utf-8")
        os.replace(staging, self.html_path)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value  # JSON has no NaN


def _page(steps) -> str:
    body = "\n".join(_step(rows) for rows in steps if rows)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>grpo_kit samples</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
div.group {{ margin: 0 0 1.5em 1em; }}
div.prompt {{ white-space: pre-wrap; font-family: monospace; background: #f3f3f3; padding: 4px 8px; max-width: 60em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }}
td.text {{ white-space: pre-wrap; font-family: monospace; max-width: 40em; }}
td.number {{ text-align: right; }}
tr.truncated td.flag {{ color: #b00; font-weight: bold; }}
</style></head><body>
<h1>grpo_kit samples</h1>
{body}
</body></html>
"""


def _step(rows: list[dict]) -> str:
    # A group's completions are adjacent in the batch; one block per prompt shows them against each other, which
    # is what their advantages are relative to.
    groups = [list(group) for _, group in itertools.groupby(rows, key=lambda row: as_text(row["prompt"]))]
    return f"<h2>step {rows[0]['step']}</h2>\n" + "\n".join(_group(group) for group in groups)


def _group(rows: list[dict]) -> str:
    names = list(rows[0]["rewards"])
    extra = list(rows[0].get("extra", {}))
    has_lengths = "completion_tokens" in rows[0]
    columns = ["completion", *(["tokens", "truncated"] if has_lengths else []), *names, *extra, "advantage"]
    head = "".join(f"<th>{html.escape(name)}</th>" for name in columns)
    lines = []
    for row in rows:
        cells = [f'<td class="text">{html.escape(as_text(row["completion"]))}</td>']
        if has_lengths:
            cells.append(f'<td class="number">{row["completion_tokens"]}</td>')
            cells.append(f'<td class="flag">{"yes" if row["truncated"] else "no"}</td>')
        cells += [f'<td class="number">{_shown(row["rewards"][name])}</td>' for name in names]
        cells += [f'<td class="text">{html.escape(str(row["extra"][name]))}</td>' for name in extra]
        cells.append(f'<td class="number">{_shown(row["advantage"])}</td>')
        truncated = ' class="truncated"' if row.get("truncated") else ""
        lines.append(f"<tr{truncated}>{''.join(cells)}</tr>")
    prompt = html.escape(as_text(rows[0]["prompt"]))
    return (
        f'<div class="group">\n<div class="prompt">{prompt}</div>\n<table><tr>{head}</tr>\n'
        + "\n".join(lines)
        + "\n</table></div>"
    )


def as_text(value) -> str:
    if isinstance(value, list):  # chat messages
        return "\n".join(_message(message) for message in value)
    return str(value)


def _message(message: dict) -> str:
    """A chat message with its role, and an assistant's tool calls, which are the whole of a turn whose content is
    empty (grpo_kit/rollout/tool_use.py)."""
    calls = [call.get("function", call) for call in message.get("tool_calls") or []]
    shown = [f"[tool call] {call.get('name', '?')}({_arguments(call.get('arguments'))})" for call in calls]
    return " ".join([f"[{message.get('role', '?')}]", *filter(None, [_content(message.get("content"))]), *shown])


def _content(content) -> str | None:
    """A message's content: text, or a list of parts (a vision-language prompt's), each image shown as [image]."""
    if not isinstance(content, list):
        return content
    return " ".join(part.get("text", "") if part.get("type") == "text" else f"[{part.get('type')}]" for part in content)


def _arguments(arguments) -> str:
    """A call's arguments as the model wrote them: a dict (parsed), or text."""
    if isinstance(arguments, dict):
        return ", ".join(f"{name}={value!r}" for name, value in arguments.items())
    return str(arguments or "")


def _shown(value: float | None) -> str:
    return "None" if value is None else f"{value:.3f}"
