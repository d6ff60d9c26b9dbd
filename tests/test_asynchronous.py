"""algorithm.max_staleness: 0 is the synchronous run exactly, and what cannot generate ahead is refused up front.

Asynchronous runs themselves need a backend that generates outside the trained model: their tests are in
plugins/grpo_kit_vllm/tests/test_asynchronous_generation.py, against the CPU test server.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.testing import tiny_run

TIMINGS = {"seconds_per_step", "train_tokens_per_second"}


def logged(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{name: value for name, value in line.items() if name not in TIMINGS} for line in lines]


def test_max_staleness_0_is_the_synchronous_run_bit_for_bit(tiny_model, tmp_path):
    runs = {}
    for name, overrides in (("default", ()), ("explicit", ("algorithm.max_staleness=0",))):
        run_dir = tmp_path / name
        grpo_kit.train(grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", *overrides)), run_dir)
        runs[name] = run_dir
    assert logged(runs["default"]) == logged(runs["explicit"])
    assert not any(name.startswith("async/") for line in logged(runs["explicit"]) for name in line)
    default, explicit = (load_file(runs[name] / "model" / "model.safetensors") for name in ("default", "explicit"))
    assert default.keys() == explicit.keys() and all(torch.equal(default[k], explicit[k]) for k in default)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (("algorithm.max_staleness=-1",), "must be 0 \\(synchronous\\) or more"),
        (("algorithm.max_staleness=1",), "generation=transformers cannot .it has no generate_in_background"),
        (
            ("algorithm.max_staleness=1", "generation=vllm_server", "+environment=calculator"),
            "tool use .* calls the tools on the training thread",
        ),
    ],
)
def test_what_cannot_generate_ahead_is_refused_before_the_model_loads(tiny_model, tmp_path, overrides, words):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", *overrides))
    with pytest.raises(ConfigError, match=words):
        grpo_kit.train(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "config.yaml").exists(), "refused before anything was written"
