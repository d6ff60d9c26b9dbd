"""trainer.log_completions: the latest generation batch's completions as a table in each tracker (read back from
what tensorboard, wandb and trackio wrote) and on the console."""

import json
import math
import os
import sqlite3
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from rich.console import Console

import grpo_kit
from grpo_kit.outputs.completion_tables import CompletionTables, markdown_table

REWARDS = torch.tensor([[1.0, 0.5], [0.0, math.nan], [1.0, 0.0], [0.0, 1.0]])  # (N, K)
ADVANTAGES = torch.tensor([0.5, -0.5, 0.25, -0.25])


def tables(rows_to_print=None, unique_prompts=False):
    console = Console(record=True, width=200)
    return CompletionTables(Accelerator(cpu=True), rows_to_print, unique_prompts, console), console


def remember(table, step=3):
    prompts = ["1+1=", "1+1=", [{"role": "user", "content": "2+2="}], [{"role": "user", "content": "2+2="}]]
    table.remember(step, prompts, ["2", "3", "4", "5|6\n7"], REWARDS, ["accuracy", "format"], ADVANTAGES)


def test_rows_hold_each_reward_and_the_advantage(fresh_accelerate_state):
    table, _ = tables()
    remember(table)
    assert table.rows[1] == {
        "step": 3,
        "prompt": "1+1=",
        "completion": "3",
        "accuracy": 0.0,
        "format": None,  # NaN: the reward had no opinion
        "advantage": -0.5,
    }
    assert table.rows[2]["prompt"] == "[user] 2+2="  # a conversation as text


def test_the_console_prints_rows_to_print_once(fresh_accelerate_state):
    table, console = tables(rows_to_print=2)
    remember(table)
    table.on_log(run=None, step=3, metrics={})
    printed = console.export_text()
    assert "completions at step 3" in printed
    assert "-0.500" in printed and "0.250" not in printed  # two rows of four
    table.on_log(run=None, step=4, metrics={})  # no new generation batch: nothing again
    assert console.export_text() == ""


def test_unique_prompts_keep_each_groups_first_completion(fresh_accelerate_state):
    table, _ = tables(unique_prompts=True)
    remember(table)
    assert [row["completion"] for row in table.rows] == ["2", "4"]


def test_markdown_cells_keep_pipes_and_newlines_inside():
    text = markdown_table(["completion", "advantage"], [["5|6\n7", 0.25]])
    assert text.splitlines() == ["| completion | advantage |", "|---|---|", "| 5\\|6<br>7 | 0.250 |"]


def test_a_run_logs_its_completions_to_every_tracker(registry, tiny_model, tmp_path, monkeypatch, capsys):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    pytest.importorskip("wandb")
    pytest.importorskip("trackio")
    monkeypatch.setenv("WANDB_MODE", "offline")
    project = f"grpo_kit-completions-{os.getpid()}"
    overrides = [
        "+reward=accuracy",
        f"model.name_or_path={tiny_model}",
        "data.num_examples=16",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.max_steps=2",
        "trainer.logging_steps=1",
        "trainer.progress_bar=false",
        "trainer.report_to=[tensorboard,wandb,trackio]",
        f"trainer.project={project}",
        "trainer.log_completions=true",
        "trainer.num_completions_to_print=3",
    ]
    run_dir = grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    batch = 8  # completions per generation batch: one micro-batch per step
    columns = ["step", "prompt", "completion", "accuracy", "advantage"]

    events = event_accumulator.EventAccumulator(str(run_dir / "trackers" / project))
    events.Reload()
    texts = events.Tensors("completions/text_summary")
    assert [event.step for event in texts] == [1, 2]
    markdown = texts[-1].tensor_proto.string_val[0].decode()
    assert markdown.splitlines()[0] == "| " + " | ".join(columns) + " |"
    assert len(markdown.splitlines()) == 2 + batch

    [offline_run] = (run_dir / "wandb").glob("offline-run-*")
    wandb_tables = sorted((offline_run / "files" / "media" / "table").glob("completions_*.table.json"))
    assert len(wandb_tables) == 2
    last = json.loads(wandb_tables[-1].read_text())
    assert last["columns"] == columns and len(last["data"]) == batch and last["data"][0][0] == 2

    database = sqlite3.connect(Path(os.environ["TRACKIO_DIR"]) / f"{project}.db")
    logged = [json.loads(row[0]) for row in database.execute("select metrics from metrics order by step")]
    trackio_tables = [line["completions"] for line in logged if "completions" in line]
    assert len(trackio_tables) == 2 and len(trackio_tables[-1]["_value"]) == batch
    assert list(trackio_tables[-1]["_value"][0]) == columns

    printed = capsys.readouterr().out
    assert printed.count("completions at step") == 2
