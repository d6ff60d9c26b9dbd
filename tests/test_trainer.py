"""The loop on a tiny random model: a few real steps change the weights and write the run directory."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import tiny_run

REQUIRED_METRICS = {
    "step",
    "reward",
    "loss",
    "rewards/accuracy/mean",
    "rewards/accuracy/std",
    "completions/mean_length",
    "learning_rate",
    "seconds_per_step",
    "grad_norm",
    "entropy",
    "clip_ratio/region_mean",
}


@pytest.fixture
def registry(digits_registry):
    return digits_registry


def run(tiny_model, *extra):
    return tiny_run(tiny_model, "+reward=[accuracy,digits]", *extra)


@pytest.mark.parametrize("loss", ["grpo", "dapo"])
def test_a_few_steps_change_the_weights_and_write_the_run(registry, tiny_model, tmp_path, loss, caplog):
    cfg = grpo_kit.compose(run(tiny_model, f"+loss={loss}", "trainer.gradient_accumulation_steps=2"), registry)
    assert cfg.model.name_or_path == str(tiny_model) and cfg.trainer.learning_rate == 1e-2
    with caplog.at_level("INFO"):
        grpo_kit.train(cfg, tmp_path, registry)
    assert f"Model saved to {tmp_path.resolve() / 'model'} (load it with from_pretrained" in caplog.text

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert REQUIRED_METRICS <= set(line), REQUIRED_METRICS - set(line)
    assert "loss:" in (tmp_path / "config.yaml").read_text()

    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert (tmp_path / "model" / "tokenizer.json").exists()


def test_off_policy_steps_use_old_log_probs(registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(run(tiny_model, "algorithm.num_iterations=2", "algorithm.steps_per_generation=2"), registry)
    grpo_kit.train(cfg, tmp_path, registry)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_batch_not_divisible_by_group_size_fails_before_loading(registry, tmp_path):
    cfg = grpo_kit.compose(["+reward=accuracy", "trainer.per_device_train_batch_size=12"], registry)
    with pytest.raises(ValueError, match="not a multiple of generation.num_generations=8"):
        grpo_kit.train(cfg, tmp_path, registry)


def test_an_existing_run_is_never_overwritten(registry, tiny_model, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg = grpo_kit.compose(run(tiny_model), registry)
    with pytest.raises(ConfigError, match="already holds a run that trained 1 step"):
        grpo_kit.train(cfg, tmp_path, registry)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


CORRECTIONS = ["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def combinations():
    for loss in LOSSES:
        for level in ["token", "sequence"]:
            for correction in CORRECTIONS:
                if not (loss == "vespo" and correction.startswith("sequence")):
                    yield loss, level, correction


def covering_set():
    """Every loss, every level and every correction at least once, the knobs of the core on some of them."""
    combos = list(combinations())
    return [combos[i] for i in range(0, len(combos), 7)] + [("vespo", "token", "token_mask")]


def train_one_step(registry, tiny_model, tmp_path, loss, level, correction, *extra):
    """One step on the tiny model, or, with tiny_model None, two steps on the embedded default."""
    overrides = [f"+loss={loss}", f"importance_sampling={level}", f"rollout_correction={correction}", *extra]
    overrides.append("algorithm.correct_policy_sampler=true")  # model=hf corrects vLLM's samples only
    if tiny_model is None:
        base = ["+reward=accuracy", "trainer.max_steps=2", "trainer.progress_bar=false"]
    else:
        base = run(tiny_model, "trainer.max_steps=1")
    cfg = grpo_kit.compose([*base, "trainer.save_model=false", *overrides], registry)
    grpo_kit.train(cfg, tmp_path, registry)
    logged = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert all(value == value for value in (logged["loss"], logged["grad_norm"])), logged  # not NaN
    return logged


@pytest.mark.parametrize(("loss", "level", "correction"), covering_set())
def test_loss_level_and_correction_train(registry, tiny_model, tmp_path, loss, level, correction):
    train_one_step(registry, tiny_model, tmp_path, loss, level, correction)


def test_every_objective_setting_of_the_core_trains(registry, tiny_model, tmp_path):
    logged = train_one_step(
        registry,
        tiny_model,
        tmp_path,
        "dapo",
        "token",
        "token_truncate",
        "algorithm.beta=0.04",
        "algorithm.top_entropy_quantile=0.2",
        "algorithm.entropy_coef=0.01",
        "algorithm.off_policy_mask_threshold=0.5",
        "algorithm.num_iterations=2",
        "algorithm.sync_ref_model=true",
        "algorithm.ref_model_sync_steps=1",
        "algorithm.mask_truncated_completions=true",
    )
    assert "kl" in logged


@pytest.mark.slow
@pytest.mark.parametrize(("loss", "level", "correction"), list(combinations()))
def test_every_loss_level_and_correction_trains_on_the_embedded_default(registry, tmp_path, loss, level, correction):
    train_one_step(registry, None, tmp_path, loss, level, correction)


def test_two_rewards_are_logged_and_their_weighted_sum_trains(registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(
        run(tiny_model, "+reward=[think_format]", "reward.digits.weight=1.0", "reward.think_format.weight=0.5"),
        registry,
    )
    grpo_kit.train(cfg, tmp_path, registry)
    for line in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()):
        weighted = sum(
            line[f"rewards/{name}/mean"] * w for name, w in [("accuracy", 1), ("digits", 1), ("think_format", 0.5)]
        )
        assert line["reward"] == pytest.approx(weighted, abs=1e-6)
        assert line["rewards/accuracy/failures"] == 0


def test_a_reward_that_raises_does_not_stop_the_run(local_plugin, tiny_model, tmp_path, caplog):
    module = local_plugin(
        "raising_reward",
        """
        import grpo_kit

        def flaky(prompts, completions, completion_ids, **columns):
            raise ConnectionError("the judge is down")

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("flaky", flaky)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module, "digits_reward"]))
    cfg = grpo_kit.compose(run(tiny_model, "+reward=[flaky]"), registry)
    grpo_kit.train(cfg, tmp_path, registry)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(line["rewards/flaky/failures"] == 1 for line in lines)
    assert "the judge is down" in caplog.text


@pytest.mark.usefixtures("trl")
def test_trl_reward_functions_by_import_path_train(registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(
        run(
            tiny_model,
            "+reward=[python]",
            "reward.python.function=trl.rewards:get_soft_overlong_punishment",
            "reward.python.factory_kwargs={max_completion_len:4,soft_punish_cache:3}",
        ),
        registry,
    )
    grpo_kit.train(cfg, tmp_path, registry)
    for line in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()):
        # lengths 1..4 against a limit of 4 with a cache of 3: penalties between -1 and 0, never a failure
        assert -1.0 <= line["rewards/python/mean"] < 0.0 and line["rewards/python/failures"] == 0
