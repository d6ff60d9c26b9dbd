"""The catalogue of bad inputs: each fails early, says what is wrong and how to fix it, and destroys nothing."""

import errno
import json
import logging

import pytest
import torch

import grpo_kit
from grpo_kit import checkpoint
from grpo_kit.compatibility import ConfigError


def tiny(tiny_model, *extra):
    return ["+loss=dapo", "+reward=accuracy", f"model.name_or_path={tiny_model}", "generation.num_generations=4",
            "trainer.per_device_train_batch_size=8", "trainer.max_steps=2", "trainer.progress_bar=false",
            "generation.max_completion_length=8", *extra]


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
    with pytest.raises(ValueError, match=r"Reward 'accuracy' needs the dataset column\(s\) solution.*columns: prompt, answer"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    cfg = grpo_kit.compose(tiny(tiny_model, f"data.path={data}", "reward.accuracy.solution_column=answer"), registry)
    grpo_kit.train(cfg, tmp_path / "fixed", registry)


def test_prompt_longer_than_the_context(registry, tiny_model, tmp_path):
    data = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "1+1=", "solution": "2"}, {"prompt": "1" * 200, "solution": "1"}])
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
    from grpo_kit import objective

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
