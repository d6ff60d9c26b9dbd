"""The catalogue of bad inputs: each fails early, says what is wrong and how to fix it, and destroys nothing."""

import errno
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

import grpo_kit
from grpo_kit.config.schema import DataConfig
from grpo_kit.contract.errors import ConfigError, InputFileError
from grpo_kit.outputs import checkpoints as checkpoint
from grpo_kit.rollout.prompts import load_prompts


def tiny(tiny_model, *extra):
    return [
        "+loss=dapo",
        "+reward=accuracy",
        f"model.name_or_path={tiny_model}",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.max_steps=2",
        "trainer.progress_bar=false",
        "generation.max_completion_length=8",
        *extra,
    ]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_no_prompt_column(registry, tiny_model, tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", [{"question": "1+1=", "solution": "2"}])
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={data}"), registry)
    with pytest.raises(ValueError, match=r"has no `prompt` column \(columns: question, solution\).*Rename"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_empty_dataset(registry, tiny_model, tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("prompt,solution\n")
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={data}"), registry)
    with pytest.raises(ValueError, match="is empty"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_reward_column_the_dataset_lacks(registry, tiny_model, tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={data}"), registry)
    message = (
        r"Reward 'accuracy' needs the dataset column\(s\) solution.*columns: prompt, answer\). "
        "Set reward.accuracy.solution_column to the column"
    )
    with pytest.raises(ValueError, match=message):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={data}", "reward.accuracy.solution_column=answer"), registry)
    grpo_kit.train(cfg, tmp_path / "fixed", registry)


def test_prompt_longer_than_the_context(registry, tiny_model, tmp_path):
    data = write_jsonl(
        tmp_path / "data.jsonl", [{"prompt": "1+1=", "solution": "2"}, {"prompt": "1" * 200, "solution": "1"}]
    )
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={data}"), registry)
    with pytest.raises(ValueError, match=r"Prompt 1 of the dataset is 200 tokens long.*context of 128 tokens"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_model_path_that_does_not_exist(registry, tmp_path):
    cfg = grpo_kit.compose(["+reward=accuracy", f"model.name_or_path={tmp_path}/no/such/model"], registry)
    with pytest.raises(FileNotFoundError, match="does not exist. Give an existing folder"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_batch_not_divisible_by_group_size(registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(tiny(tiny_model, "trainer.per_device_train_batch_size=6"), registry)
    with pytest.raises(ValueError, match="not a multiple of generation.num_generations=4: change one of them"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_group_advantage_with_one_generation(registry):
    with pytest.raises(ConfigError, match="needs generation.num_generations >= 2"):
        grpo_kit.compose(["+reward=accuracy", "generation.num_generations=1"], registry)


def test_tokenizer_without_pad_token_pads_with_eos(registry, tmp_path, caplog):
    from transformers import AutoTokenizer

    from grpo_kit.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(model)
    with caplog.at_level(logging.INFO):
        grpo_kit.train(grpo_kit.compose(tiny(model), registry), tmp_path / "run", registry)
    assert "has no pad token: padding with its EOS token" in caplog.text


def test_non_finite_loss_skips_steps_then_saves_and_stops(registry, tiny_model, tmp_path, monkeypatch, caplog):
    from grpo_kit.objective import objective

    real = objective.Objective.__call__
    monkeypatch.setattr(objective.Objective, "__call__", lambda self, *a, **k: _nan_loss(real(self, *a, **k)))
    cfg = grpo_kit.compose(tiny(tiny_model, "trainer.max_steps=10", "trainer.max_bad_steps=3"), registry)
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="3 steps in a row had a non-finite loss"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    assert "skipping the step" in caplog.text
    assert (tmp_path / "run" / "checkpoints" / "step-000003").exists()


def _nan_loss(out):
    out.loss = out.loss * torch.tensor(float("nan"))
    return out


def test_full_disk_while_saving_keeps_the_previous_checkpoint(registry, tiny_model, tmp_path, monkeypatch):
    cfg = grpo_kit.compose(tiny(tiny_model, "trainer.max_steps=3", "trainer.save_steps=1"), registry)
    real_save, calls = torch.save, []

    def save(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(OSError, match=r"could not be written.*step-000001 is intact"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    kept = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert [path.name for path in kept] == ["step-000001"]
    assert (kept[0] / "state.pt").exists()


def never_loaded(monkeypatch):
    """Make loading a model fail the test: the error under test must come first."""
    from grpo_kit.training import setup

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was found")

    monkeypatch.setattr(setup, "load_model", load_model)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("generation.temperature=0", r"generation.temperature=0.0 must be positive: .* Use 1.0 to sample"),
        ("generation.temperature=-1", r"generation.temperature=-1.0 must be positive"),
        ("generation.num_generations=0", r"generation.num_generations=0 must be at least 1: it is the number of comp"),
        ("generation.max_completion_length=0", r"generation.max_completion_length=0 must be at least 1"),
    ],
)
def test_generation_settings_the_core_cannot_take(registry, setting, message):
    with pytest.raises(ConfigError, match=message):
        grpo_kit.compose(["+reward=accuracy", setting], registry)


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf", "-1e39"])
def test_a_reward_weight_beyond_float32_is_refused_when_composed(registry, weight):
    with pytest.raises(ConfigError, match=r"reward.accuracy.weight=.*must be a finite number within float32"):
        grpo_kit.compose(["+reward=accuracy", f"reward.accuracy.weight={weight}"], registry)


def test_a_correct_threshold_that_is_no_number_is_refused_when_composed(registry):
    with pytest.raises(ConfigError, match=r"eval.correct_threshold=nan must be a finite number"):
        grpo_kit.compose(["+reward=accuracy", "eval.correct_threshold=nan"], registry)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("generation.top_p=0", r"generation.top_p=0.0 must lie in \(0, 1\]: .* Use 1.0 to turn it off"),
        ("generation.top_p=1.5", r"generation.top_p=1.5 must lie in \(0, 1\]"),
        ("generation.top_k=-1", r"generation.top_k=-1 must be a positive number of tokens .* or null"),
        ("generation.min_p=1.5", r"generation.min_p=1.5 must lie in \[0, 1\]: .* Use null to turn it off"),
        ("generation.repetition_penalty=0", r"generation.repetition_penalty=0.0 must be positive: 1.0 leaves"),
    ],
)
def test_sampling_settings_transformers_cannot_take_fail_before_the_model_loads(
    registry, tiny_model, tmp_path, monkeypatch, setting, message
):
    never_loaded(monkeypatch)
    cfg = grpo_kit.compose(tiny(tiny_model, setting), registry)
    with pytest.raises(ConfigError, match=message):
        grpo_kit.train(cfg, tmp_path / "run", registry)


@pytest.mark.parametrize("steps", [0, -2])
def test_max_steps_that_train_nothing(registry, steps):
    with pytest.raises(ConfigError, match=rf"trainer.max_steps={steps} would train nothing: .* trainer.max_steps=-1"):
        grpo_kit.compose(["+reward=accuracy", f"trainer.max_steps={steps}"], registry)


def test_max_steps_minus_one_needs_epochs(registry):
    assert grpo_kit.compose(["+reward=accuracy", "trainer.max_steps=-1"], registry).trainer.max_steps == -1
    with pytest.raises(ConfigError, match=r"trainer.num_train_epochs=0.0: give a positive number of epochs"):
        grpo_kit.compose(["+reward=accuracy", "trainer.max_steps=-1", "trainer.num_train_epochs=0"], registry)


@pytest.mark.parametrize("path", ["./missing", "missing.jsonl", "data/train/missing", "~/no/such/prompts"])
def test_a_local_data_path_that_does_not_exist_is_named(registry, tiny_model, tmp_path, monkeypatch, path):
    never_loaded(monkeypatch)
    monkeypatch.chdir(tmp_path)
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path='{path}'"), registry)
    with pytest.raises(InputFileError, match=rf"data.path={path} does not exist \(looked for /.*\). Give an existing"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_an_eval_path_that_does_not_exist_is_named(registry, tiny_model, tmp_path, monkeypatch):
    never_loaded(monkeypatch)
    cfg = grpo_kit.compose(tiny(tiny_model, f"eval.path={tmp_path}/eval.jsonl"), registry)
    with pytest.raises(InputFileError, match=rf"path={tmp_path}/eval.jsonl does not exist"):
        grpo_kit.train(cfg, tmp_path / "run", registry)


@pytest.mark.parametrize(
    "name, text, line",
    [
        ("data.jsonl", '{"prompt": "1+1=", "solution": "2"}\n{"prompt": "2+2=", "solution": "4"\n{"prompt": "3"}\n', 2),
        ("data.jsonl", '{"prompt": "1+1=", "solution": "2"}\n\n{"prompt": "2+2=", solution: "4"}\n', 3),
        ("data.json", '[\n  {"prompt": "1+1=", "solution": "2"},\n  {"prompt": "2+2=" "solution": "4"}\n]\n', 3),
    ],
)
def test_a_malformed_json_line_is_named_by_file_and_line(registry, tiny_model, tmp_path, monkeypatch, name, text, line):
    never_loaded(monkeypatch)
    (tmp_path / name).write_text(text)
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={tmp_path / name}"), registry)
    message = rf"data.path={tmp_path / name} could not be read: line {line} is not valid JSON \(.* column \d+\)"
    with pytest.raises(InputFileError, match=message):
        grpo_kit.train(cfg, tmp_path / "run", registry)


def test_the_cli_says_which_line_of_a_jsonl_is_malformed_in_a_few_lines(tiny_model, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "1+1=", "solution": "2"}\n{"prompt": "2+2=", "solution": "4"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+reward=accuracy",
            f"model.name_or_path={tiny_model}",
            f"data.path={data}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1"},
    )
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode != 0
    assert f"{data} could not be read: line 2 is not valid JSON" in result.stdout + result.stderr
    assert len(output) < 10, output


def test_a_model_folder_without_config_json(registry, tmp_path, monkeypatch):
    never_loaded(monkeypatch)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    cfg = grpo_kit.compose(["+reward=accuracy", f"model.name_or_path={folder}"], registry)
    message = rf"model.name_or_path={folder} is not a saved model: .* not a folder with a config.json. Give the folder"
    with pytest.raises(InputFileError, match=message):
        grpo_kit.train(cfg, tmp_path / "run", registry)


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("data.jsonl", '{"prompt": "1+1="}\n{"prompt": ""}\n', r"row 2 \(counting from 1\), .* that is empty"),
        (
            "data.jsonl",
            '{"prompt": "1+1="}\n{"prompt": null}\n',
            r"row 2 .* that is missing \(null, or an empty cell\)",
        ),
        ("data.jsonl", '{"prompt": "1+1="}\n{"prompt": 12}\n', r"row 2 .* that is 12 \(int\), not text"),
        ("data.csv", "prompt,solution\n7,7\n", r"row 1 .* that is 7 \(int\), not text"),  # a column of numbers
        (
            "data.jsonl",
            '{"prompt": "1+1="}\n{"prompt": ["2+2="]}\n',
            r"row 2 .* that is a list, but not of chat messages",
        ),
    ],
)
def test_a_bad_prompt_is_named_by_file_and_row_before_the_model_loads(
    registry, tiny_model, tmp_path, monkeypatch, name, text, message
):
    never_loaded(monkeypatch)
    (tmp_path / name).write_text(text)
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={tmp_path / name}"), registry)
    with pytest.raises(ConfigError, match=rf"data.path={tmp_path / name}: {message}.*Give every row a non-empty"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_column_may_mix_text_and_chat_prompts(tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "1+1="}, {"prompt": [{"role": "user", "content": "2+2="}]}])
    assert len(load_prompts(DataConfig(path=str(data)))) == 2


def test_chat_prompts_for_a_tokenizer_without_a_chat_template_are_named(registry, tiny_model, tmp_path):
    rows = [{"prompt": "1+1=", "solution": "2"}, {"prompt": [{"role": "user", "content": "2+2="}], "solution": "4"}]
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={write_jsonl(tmp_path / 'data.jsonl', rows)}"), registry)
    with pytest.raises(
        ConfigError,
        match=r"Row 2 of the dataset .* is a list of chat messages, but the model's "
        r"tokenizer has no chat template",
    ):
        grpo_kit.train(cfg, tmp_path / "run", registry)


@pytest.mark.parametrize("name", ["data.jsonl", "data.json", "data.csv"])
def test_an_empty_file_is_called_empty(tmp_path, name):
    (tmp_path / name).write_text("")
    with pytest.raises(ConfigError, match=r"The dataset .* is empty: it needs at least one row"):
        load_prompts(DataConfig(path=str(tmp_path / name)))


@pytest.mark.parametrize(
    "name, data, line, column",
    [
        ("data.jsonl", b'{"prompt": "1+1="}\n{"prompt": "caf\xe9"}\n', 2, 16),
        ("data.csv", b"prompt,solution\ncaf\xe9,2\n", 2, 4),
    ],
)
def test_bytes_that_are_not_utf8_are_named_by_line_and_column(tmp_path, name, data, line, column):
    (tmp_path / name).write_bytes(data)
    message = rf"data.path={tmp_path / name} is not UTF-8 text: line {line} has the byte 0xe9 at column {column}\. Save"
    with pytest.raises(InputFileError, match=message):
        load_prompts(DataConfig(path=str(tmp_path / name)))
