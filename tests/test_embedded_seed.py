"""The run that builds the embedded model (the first on a machine) trains exactly as every later run does."""

import json

import pytest

import grpo_kit


def logged(run_dir) -> list[tuple[float, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(line["reward"], line["loss"]) for line in lines]


@pytest.mark.slow
def test_building_the_embedded_model_leaves_the_runs_random_streams_alone(registry, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_KIT_CACHE", str(cache))
    overrides = [
        "+reward=accuracy",
        "trainer.max_steps=5",
        "trainer.per_device_train_batch_size=32",
        "trainer.progress_bar=false",
        "eval.split=null",
        "eval.on_start=false",
    ]
    for name in ("builds_the_model", "finds_it_built"):
        grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / name, registry)
    assert len(list(cache.glob("embedded-model-*"))) == 1
    assert len(logged(tmp_path / "builds_the_model")) == 5
    assert logged(tmp_path / "builds_the_model") == logged(tmp_path / "finds_it_built")
