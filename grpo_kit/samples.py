"""Samples of what the policy writes, every few steps: samples.jsonl (all of them) and samples.html (the latest).

Each recorded step adds the first `max_rows` completions of its generation batch, so whole groups of one prompt
stand side by side, with each reward and the advantage they earned.
"""

import html
import json
import math
import os
from collections import deque
from pathlib import Path

import torch

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
    ) -> None:
        if step % self.every:
            return
        rows = [
            {
                "step": step,
                "prompt": prompt,
                "completion": completion,
                "rewards": {name: _number(value) for name, value in zip(reward_names, rewards)},
                "advantage": _number(advantage),
            }
            for prompt, completion, rewards, advantage in zip(
                prompts[: self.max_rows],
                completions[: self.max_rows],
                rewards_per_func[: self.max_rows].tolist(),
                advantages[: self.max_rows].tolist(),
            )
        ]
        with self.jsonl_path.open("a", encoding="utf-8") as file:
            file.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        self.recent.appendleft(rows)
        # Written aside and moved into place, so a browser refreshing the page never reads half of it.
        staging = self.html_path.with_suffix(".html.tmp")
        staging.write_text(_page(self.recent), encoding="utf-8")
        os.replace(staging, self.html_path)


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value  # JSON has no NaN


def _page(tables) -> str:
    body = "\n".join(_table(rows) for rows in tables if rows)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>grpo_kit samples</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; }}
td.text {{ white-space: pre-wrap; font-family: monospace; max-width: 40em; }}
td.number {{ text-align: right; }}
</style></head><body>
<h1>grpo_kit samples</h1>
{body}
</body></html>
"""


def _table(rows: list[dict]) -> str:
    names = list(rows[0]["rewards"])
    head = "".join(f"<th>{html.escape(name)}</th>" for name in ["prompt", "completion", *names, "advantage"])
    lines = []
    for row in rows:
        cells = [f'<td class="text">{html.escape(_text(row[key]))}</td>' for key in ("prompt", "completion")]
        cells += [f'<td class="number">{_shown(row["rewards"][name])}</td>' for name in names]
        cells.append(f'<td class="number">{_shown(row["advantage"])}</td>')
        lines.append(f"<tr>{''.join(cells)}</tr>")
    return f"<h2>step {rows[0]['step']}</h2>\n<table><tr>{head}</tr>\n" + "\n".join(lines) + "\n</table>"


def _text(value) -> str:
    if isinstance(value, list):  # chat messages
        return "\n".join(f"[{message.get('role', '?')}] {message.get('content', '')}" for message in value)
    return str(value)


def _shown(value: float | None) -> str:
    return "None" if value is None else f"{value:.3f}"
