"""TRL's housekeeping options, as trainer options of the same names: ddp_timeout, tf32, torch_empty_cache_steps and
logging_first_step (docs/trl.md)."""

import json
from datetime import timedelta

import pytest
import torch

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.testing import tiny_run
from grpo_kit.training import loop
from grpo_kit.training.setup import build_accelerator


def test_the_process_group_waits_as_long_as_trl_s_does(tiny_model, tmp_path):
    for seconds, overrides in ((1800, ()), (60, ("trainer.ddp_timeout=60",))):
        cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", *overrides))
        accelerator = build_accelerator(cfg.trainer, tmp_path, [])
        assert accelerator.init_handler.timeout == timedelta(seconds=seconds)


@pytest.mark.parametrize("tf32", [True, False])
def test_tf32_sets_torch_s_switches(tiny_model, tmp_path, tf32):
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", f"trainer.tf32={str(tf32).lower()}"))
        build_accelerator(cfg.trainer, tmp_path, [])
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (tf32, tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def logged_steps(tiny_model, run_dir, *overrides) -> list[int]:
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "trainer.save_model=false", *overrides))
    grpo_kit.train(cfg, run_dir)
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_logging_first_step_logs_step_1_whatever_logging_steps(tiny_model, tmp_path):
    every_other = ("trainer.logging_steps=2", "trainer.max_steps=4")
    assert logged_steps(tiny_model, tmp_path / "plain", *every_other) == [2, 4]
    assert logged_steps(tiny_model, tmp_path / "first", *every_other, "trainer.logging_first_step=true") == [1, 2, 4]


def test_the_device_cache_is_emptied_every_n_steps(tiny_model, tmp_path, monkeypatch):
    emptied_at = []
    real = loop.clear_device_cache

    def counted():
        emptied_at.append(len(emptied_at))
        real()

    monkeypatch.setattr(loop, "clear_device_cache", counted)
    logged_steps(tiny_model, tmp_path, "trainer.max_steps=5", "trainer.torch_empty_cache_steps=2")
    assert len(emptied_at) == 2  # after steps 2 and 4


@pytest.mark.parametrize(
    "override, message",
    [("trainer.ddp_timeout=0", "trainer.ddp_timeout=0"), ("trainer.torch_empty_cache_steps=0", "at least 1")],
)
def test_bad_housekeeping_options_are_refused(tiny_model, override, message):
    with pytest.raises(ConfigError, match=message):
        grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", override))
