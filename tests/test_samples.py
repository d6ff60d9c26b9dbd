"""SampleLog: every `every` steps, the completions of each prompt with their length, rewards and advantage, as JSONL
and HTML."""

import json
import math

import pytest
import torch

from grpo_kit.contract.kinds import Completions
from grpo_kit.outputs.samples import PAGE_STEPS, SampleLog

PROMPTS = ["1+1=", "1+1=", "2+2=", "2+2="]
COMPLETIONS = ["2", "3", "<script>alert(1)</script>", "4"]
REWARDS = torch.tensor([[1.0, 0.5], [0.0, math.nan], [0.0, 0.5], [1.0, 0.5]])
ADVANTAGES = torch.tensor([0.7071, -0.7071, -0.7071, 0.7071])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])  # the third ran into max_completion_length
GENERATED = Completions(
    completion_ids=torch.zeros(4, 3, dtype=torch.long),
    completion_mask=MASK,
    is_truncated=torch.tensor([False, False, True, False]),
)


def record(log: SampleLog, step: int, completions=COMPLETIONS) -> None:
    log.record(step, PROMPTS, completions, REWARDS, ["accuracy", "format"], ADVANTAGES, GENERATED)


def lines(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]


def test_writes_only_every_n_steps_and_at_most_max_rows(tmp_path):
    log = SampleLog(tmp_path, every=2, max_rows=3)
    for step in range(5):
        record(log, step)
    rows = lines(tmp_path)
    assert [row["step"] for row in rows] == [0, 0, 0, 2, 2, 2, 4, 4, 4]
    assert rows[1] == {
        "step": 0,
        "prompt": "1+1=",
        "completion": "3",
        "completion_tokens": 1,
        "truncated": False,
        "rewards": {"accuracy": 0.0, "format": None},  # no opinion is null, not NaN, which JSON lacks
        "advantage": pytest.approx(-0.7071),
    }


def test_page_escapes_text_and_shows_newest_step_first(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=4)
    record(log, 1)
    record(log, 2)
    page = (tmp_path / "samples.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.index("step 2") < page.index("step 1")
    head = "<th>completion</th><th>tokens</th><th>truncated</th><th>accuracy</th><th>format</th><th>advantage</th>"
    assert head in page
    assert "0.707" in page and "None" in page
    assert not list(tmp_path.glob("*.tmp"))


def test_page_keeps_only_the_latest_steps(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=1)
    for step in range(PAGE_STEPS + 3):
        record(log, step)
    page = (tmp_path / "samples.html").read_text()
    assert f"step {PAGE_STEPS + 2}<" in page and "step 2<" not in page
    assert len(lines(tmp_path)) == PAGE_STEPS + 3


def test_chat_messages_are_shown_by_role(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=1)
    chat = [[{"role": "assistant", "content": "<b>2</b>"}]] * 4
    log.record(0, [[{"role": "user", "content": "1+1?"}]] * 4, chat, REWARDS, ["accuracy", "format"], ADVANTAGES)
    page = (tmp_path / "samples.html").read_text()
    assert "[user] 1+1?" in page and "[assistant] &lt;b&gt;2&lt;/b&gt;" in page
    assert lines(tmp_path)[0]["completion"] == [{"role": "assistant", "content": "<b>2</b>"}]


def test_a_message_of_image_and_text_parts_shows_its_images_in_place(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=1)
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "how many?"}]}]
    log.record(
        0, [prompt] * 4, [[{"role": "assistant", "content": "3"}]] * 4, REWARDS, ["accuracy", "format"], ADVANTAGES
    )
    assert "[user] [image] how many?" in (tmp_path / "samples.html").read_text()


def test_a_tool_call_is_shown_in_its_assistant_turn(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=1)
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    turns = [
        {"role": "assistant", "content": "", "tool_calls": [call]},  # a tool call's turn has no content of its own
        {"role": "tool", "name": "add", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    log.record(0, [[{"role": "user", "content": "2+3?"}]] * 4, [turns] * 4, REWARDS, ["accuracy", "format"], ADVANTAGES)
    page = (tmp_path / "samples.html").read_text()
    assert "[assistant] [tool call] add(a=2, b=3)\n[tool] 5\n[assistant] 5" in page


def test_invalid_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="every >= 1"):
        SampleLog(tmp_path, every=0, max_rows=4)


def test_page_has_one_block_per_prompt_with_each_completions_length_and_truncation(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=4)
    record(log, 3)
    page = (tmp_path / "samples.html").read_text()
    assert page.count('<div class="group">') == 2
    assert page.count("1+1=") == 1 and page.count("2+2=") == 1  # each prompt once, above its completions
    first_block, second_block = page.split('<div class="group">')[1:]
    assert '<td class="text">2</td>' in first_block and '<td class="text">3</td>' in first_block
    assert "2+2=" not in first_block
    assert '<tr class="truncated">' in second_block and '<td class="flag">yes</td>' in second_block
    assert [(row["completion_tokens"], row["truncated"]) for row in lines(tmp_path)] == [
        (2, False),
        (1, False),
        (3, True),
        (3, False),
    ]


def test_without_the_generated_tensors_lengths_are_left_out(tmp_path):
    log = SampleLog(tmp_path, every=1, max_rows=2)
    log.record(0, PROMPTS, COMPLETIONS, REWARDS, ["accuracy", "format"], ADVANTAGES)
    assert "completion_tokens" not in lines(tmp_path)[0]
    assert "<th>tokens</th>" not in (tmp_path / "samples.html").read_text()
