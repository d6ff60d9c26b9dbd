"""trainer.metric_for_best_model: a run whose eval reward peaks mid-run keeps that checkpoint through
save_total_limit, and load_best_model_at_end makes its weights the final model; and the settings it refuses."""

import json

import pytest
import torch
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.outputs.best_checkpoint import BestCheckpoint
from grpo_kit.outputs.checkpoints import load_checkpoint

PEAK = 4  # the step whose evaluation scores best


@pytest.fixture
def peaking_registry(local_plugin, registry):
    # Scored with the trainer's step: an evaluation after step s scores -(s - PEAK)^2, give or take 0.1 by the
    # completion's length, which gives the completions of a group advantages to train on.
    local_plugin(
        "peaking_reward",
        f"""
        def peak(completions, trainer_state, **columns):
            return [-float(trainer_state.global_step - {PEAK}) ** 2 + 0.1 * (len(c) % 2) for c in completions]
        """,
    )
    return registry


def overrides(tiny_model, *more):
    return [
        "+reward=python",
        "reward.python.function=peaking_reward:peak",
        f"model.name_or_path={tiny_model}",
        "data.num_examples=16",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.learning_rate=1e-2",
        "trainer.max_steps=8",
        "trainer.save_steps=2",
        "trainer.logging_steps=2",
        "trainer.progress_bar=false",
        "eval.split=test",
        "eval.steps=2",
        "eval.num_examples=4",
        *more,
    ]


def test_the_best_checkpoint_survives_the_limit_and_becomes_the_model(peaking_registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(
        overrides(
            tiny_model,
            "trainer.save_total_limit=1",
            "trainer.metric_for_best_model=eval/reward",
            "trainer.load_best_model_at_end=true",
        ),
        peaking_registry,
    )
    run_dir = grpo_kit.train(cfg, tmp_path / "run", peaking_registry)
    checkpoints = run_dir / "checkpoints"
    assert sorted(path.name for path in checkpoints.glob("step-*")) == [f"step-{PEAK:06d}", "step-000008"]
    record = json.loads((checkpoints / "best.json").read_text())
    assert (record["metric"], record["step"], record["checkpoint"]) == ("eval/reward", PEAK, f"step-{PEAK:06d}")
    assert 0 <= record["value"] <= 0.1

    final = load_file(run_dir / "model" / "model.safetensors")
    best = load_checkpoint(checkpoints / f"step-{PEAK:06d}")["model"]
    last = load_checkpoint(checkpoints / "step-000008")["model"]
    name = next(key for key in final if key in best and key.endswith("mlp.up_proj.weight"))
    assert torch.equal(final[name], best[name])
    assert not torch.equal(final[name], last[name])  # the weights moved after the peak


def test_without_load_best_the_model_is_the_last_steps(peaking_registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(
        overrides(tiny_model, "trainer.save_total_limit=1", "trainer.metric_for_best_model=eval/reward"),
        peaking_registry,
    )
    run_dir = grpo_kit.train(cfg, tmp_path / "run", peaking_registry)
    final = load_file(run_dir / "model" / "model.safetensors")
    last = load_checkpoint(run_dir / "checkpoints" / "step-000008")["model"]
    name = next(key for key in final if key in last and key.endswith("mlp.up_proj.weight"))
    assert torch.equal(final[name], last[name])
    assert (run_dir / "checkpoints" / f"step-{PEAK:06d}").exists()


def test_smaller_is_better_for_a_loss_unless_told(tmp_path):
    def judged(metric, greater, values):
        trainer = type("T", (), {"metric_for_best_model": metric, "greater_is_better": greater})
        best = BestCheckpoint.of(trainer)
        for step, value in enumerate(values, start=1):
            protect, record = best.judge(tmp_path, step, {metric: value})
            if record is not None:
                (tmp_path / "best.json").write_text(json.dumps(record))
        return json.loads((tmp_path / "best.json").read_text())["step"]

    assert judged("loss", None, [0.5, 0.1, 0.3]) == 2
    (tmp_path / "best.json").unlink()
    assert judged("reward", None, [0.5, 0.1, 0.3]) == 1
    (tmp_path / "best.json").unlink()
    assert judged("loss", True, [0.5, 0.1, float("nan"), 0.7]) == 4  # a NaN never wins


@pytest.mark.parametrize(
    "settings, said",
    [
        (["trainer.load_best_model_at_end=true"], "needs trainer.metric_for_best_model"),
        (["trainer.greater_is_better=true"], "needs trainer.metric_for_best_model"),
        (["trainer.metric_for_best_model=eval/reward", "eval.split=null"], "no eval set is named"),
        (["trainer.metric_for_best_model=eval/reward", "eval.steps=3"], "multiple of eval.steps"),
        (["trainer.metric_for_best_model=reward", "trainer.logging_steps=3"], "multiple of logging_steps"),
        (
            [
                "trainer.metric_for_best_model=reward",
                "trainer.load_best_model_at_end=true",
                "trainer.save_only_model=true",
            ],
            "whole checkpoints",
        ),
    ],
)
def test_settings_that_cannot_judge_are_refused(peaking_registry, tiny_model, settings, said):
    with pytest.raises(ConfigError, match=said):  # when the run is composed, before any work
        grpo_kit.compose(overrides(tiny_model, *settings), peaking_registry)


def test_a_metric_never_logged_stops_after_saving(peaking_registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(overrides(tiny_model, "trainer.metric_for_best_model=eval/rewrd"), peaking_registry)
    with pytest.raises(ConfigError, match="eval/rewrd was not logged at step 2.*eval/reward"):
        grpo_kit.train(cfg, tmp_path / "run", peaking_registry)
    assert (tmp_path / "run" / "checkpoints" / "step-000002").exists()  # the step's work is kept


def test_a_resumed_run_compares_with_the_best_before_it(peaking_registry, tiny_model, tmp_path):
    """Stopped after the peak and resumed: the later, worse checkpoints do not replace the peak's."""
    settings = ["trainer.save_total_limit=1", "trainer.metric_for_best_model=eval/reward"]
    settings += ["trainer.lr_scheduler_type=constant"]  # a constant schedule lets a resumed run be longer
    first = grpo_kit.compose(overrides(tiny_model, *settings, "trainer.max_steps=4"), peaking_registry)
    run_dir = grpo_kit.train(first, tmp_path / "run", peaking_registry)
    resumed = overrides(tiny_model, *settings, "trainer.resume=auto")
    grpo_kit.train(grpo_kit.compose(resumed, peaking_registry), run_dir, peaking_registry)
    checkpoints = run_dir / "checkpoints"
    assert json.loads((checkpoints / "best.json").read_text())["step"] == PEAK
    assert sorted(path.name for path in checkpoints.glob("step-*")) == [f"step-{PEAK:06d}", "step-000008"]
