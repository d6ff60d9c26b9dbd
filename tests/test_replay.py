"""Frozen rollouts: every variant replaying a recorded run sees identical rewards and advantages at every step."""

import pytest
import torch

import grpo_kit
from grpo_kit.contract.errors import InputFileError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.rollout.replay import RolloutReplay


@pytest.fixture
def registry(local_plugin):
    module = local_plugin(
        "length_reward",
        """
        import grpo_kit

        def length(prompts, completions, completion_ids, **columns):
            return [float(len(ids)) for ids in completion_ids]

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("length", length)
    """,
    )
    return Registry(plugin_manager(local_modules=[module]))


def run(registry, tiny_model, directory, *overrides):
    cfg = grpo_kit.compose(
        [
            "+reward=length",
            f"model.name_or_path={tiny_model}",
            "generation.num_generations=4",
            "generation.max_completion_length=6",
            "trainer.per_device_train_batch_size=8",
            "trainer.max_steps=3",
            "trainer.learning_rate=1e-2",
            "trainer.progress_bar=false",
            "trainer.save_model=false",
            "rollout_files.save=true",
            *overrides,
        ],
        registry,
    )
    grpo_kit.train(cfg, directory, registry)
    return [torch.load(path, weights_only=False) for path in sorted((directory / "rollouts").glob("*.pt"))]


def test_variants_replaying_one_run_see_identical_rewards_and_advantages(registry, tiny_model, tmp_path):
    recorded = run(registry, tiny_model, tmp_path / "recorded", "seed=1")
    variants = [
        run(registry, tiny_model, tmp_path / name, f"rollout_files.replay={tmp_path / 'recorded'}", *overrides)
        for name, overrides in [
            ("grpo", ["+loss=grpo", "seed=2"]),
            ("gspo", ["+loss=grpo", "importance_sampling=sequence", "seed=3"]),
            ("cispo", ["+loss=cispo", "seed=4"]),
        ]
    ]
    assert len(recorded) == 3 and torch.unique(recorded[0]["rewards"]).numel() > 1
    for variant in variants:
        for ours, theirs in zip(variant, recorded, strict=True):
            assert ours["completion_ids"] == theirs["completion_ids"]
            torch.testing.assert_close(ours["rewards"], theirs["rewards"])
            torch.testing.assert_close(ours["advantages"], theirs["advantages"])


def test_replay_checks_the_batch_shape_before_loading_a_model(registry, tiny_model, tmp_path):
    run(registry, tiny_model, tmp_path / "recorded")
    cfg = grpo_kit.compose(
        ["+reward=length", "generation.num_generations=8", f"rollout_files.replay={tmp_path / 'recorded'}"], registry
    )
    with pytest.raises(ValueError, match="hold 8 completions of 4 per prompt"):
        grpo_kit.train(cfg, tmp_path / "other", registry)


class RunsCode:
    """What a crafted rollouts file may hold: unpickling it calls `marker.write_text`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).write_text, (self.marker, "ran"))


def test_a_rollouts_file_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "marker"
    (tmp_path / "rollouts").mkdir()
    torch.save({"rows": [RunsCode(marker)]}, tmp_path / "rollouts" / "000001.pt")
    with pytest.raises(InputFileError, match=r"000001\.pt holds more than tensors and plain data"):
        RolloutReplay(tmp_path, num_generations=4, batch_size=8)
    assert not marker.exists()
