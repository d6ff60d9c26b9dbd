"""algorithm.max_staleness: what cannot generate ahead is refused up front. (0, the default, is the synchronous run:
tests/test_default_run.py pins what it computes.)

Asynchronous runs themselves need a backend that generates outside the trained model: their tests are in
plugins/grpo_kit_vllm/tests/test_asynchronous_generation.py, against the CPU test server.
"""

import json

import pytest

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.testing import tiny_run

TIMINGS = {"seconds_per_step", "train_tokens_per_second"}


def logged(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{name: value for name, value in line.items() if name not in TIMINGS} for line in lines]


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
