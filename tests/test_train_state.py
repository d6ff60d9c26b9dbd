"""TrainState: a run resumed from any of its checkpoints ends with the weights of the run that never stopped.

These resume in-process from a middle checkpoint; tests/test_resume.py kills a real process with SIGKILL.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.testing import tiny_run


@pytest.fixture
def registry(digits_registry):
    return digits_registry


def overrides(tiny_model, *extra):
    return tiny_run(
        tiny_model,
        "+reward=digits",
        "trainer.max_steps=4",
        "trainer.save_steps=2",
        "trainer.save_total_limit=5",
        "algorithm.steps_per_generation=2",
        "algorithm.num_iterations=2",  # pending batches cross step boundaries
        *extra,
    )


ONE_BATCH_A_STEP = ["algorithm.steps_per_generation=1", "algorithm.num_iterations=1"]


def resumed_from_step_2(registry, tiny_model, unbroken, resumed, *extra):
    """Train `resumed` from the step-2 checkpoint of `unbroken`, a finished run of the same settings."""
    checkpoint = unbroken / "checkpoints" / "step-000002"
    cfg = grpo_kit.compose([*overrides(tiny_model, *extra), f"trainer.resume={checkpoint}"], registry)
    grpo_kit.train(cfg, resumed, registry)


def assert_same_weights(a, b):
    ours, theirs = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


@pytest.mark.parametrize(
    "extra",
    [
        [],
        # TR-DPO moves the reference model at steps 2 and 4: the checkpoint must hold the moved one, which the
        # batches generated at steps 3 and 4 take their reference log-probs from.
        ["algorithm.beta=0.04", "algorithm.sync_ref_model=true", "algorithm.ref_model_sync_steps=2", *ONE_BATCH_A_STEP],
    ],
    ids=["default", "moving-reference"],
)
def test_resuming_from_a_middle_checkpoint_ends_like_the_unbroken_run(registry, tiny_model, tmp_path, extra):
    unbroken, resumed = tmp_path / "unbroken", tmp_path / "resumed"
    grpo_kit.train(grpo_kit.compose(overrides(tiny_model, *extra), registry), unbroken, registry)
    resumed_from_step_2(registry, tiny_model, unbroken, resumed, *extra)
    assert_same_weights(resumed, unbroken)


def test_a_resumed_replay_goes_on_from_its_batch_and_its_recording_from_its_file(registry, tiny_model, tmp_path):
    recorded, unbroken, resumed = tmp_path / "recorded", tmp_path / "unbroken", tmp_path / "resumed"
    recording = overrides(tiny_model, "rollout_files.save=true", *ONE_BATCH_A_STEP)
    grpo_kit.train(grpo_kit.compose(recording, registry), recorded, registry)
    replaying = [f"rollout_files.replay={recorded}", "rollout_files.save=true", *ONE_BATCH_A_STEP]
    grpo_kit.train(grpo_kit.compose(overrides(tiny_model, *replaying), registry), unbroken, registry)
    # The resumed run's own recording goes on from the checkpoint: it starts with the files recorded before it.
    shutil.copytree(unbroken / "rollouts", resumed / "rollouts")
    for late in sorted((resumed / "rollouts").glob("*.pt"))[2:]:
        late.unlink()
    resumed_from_step_2(registry, tiny_model, unbroken, resumed, *replaying)

    assert_same_weights(resumed, unbroken)
    assert sorted(p.name for p in (resumed / "rollouts").glob("*.pt")) == [f"00000{i}.pt" for i in (1, 2, 3, 4)]
    recordings = [torch.load(d / "rollouts" / "000004.pt", weights_only=False) for d in (resumed, unbroken)]
    assert torch.equal(recordings[0]["generated"]["completion_ids"], recordings[1]["generated"]["completion_ids"])


def test_a_generator_lost_mid_step_saves_the_last_whole_step_and_the_resumed_run_ends_like_the_unbroken_one(
    local_plugin, tiny_model, tmp_path
):
    """Two micro-batches a step, each with its own generation batch: the generator fails at step 3's second one.

    The half-done step is undone (its sampler draws, gradients, metrics and random generators), step 2 is saved,
    and the run stops with the command that resumes it. Resumed, it ends with the unbroken run's weights.
    """
    module = local_plugin(
        "lost_generator",
        """
        from dataclasses import dataclass

        import grpo_kit
        from grpo_kit.contract.errors import GenerationUnavailable
        from grpo_kit_transformers.generation import TransformersGeneration, TransformersGenerationConfig

        @dataclass
        class LostConfig(TransformersGenerationConfig):
            lose_at_call: int = 0  # 0: never

        class LostOnce(TransformersGeneration):
            calls, lost = 0, False  # calls by this run; lost: in any run of this process

            def generate(self, prompt_ids, with_logprobs=False):
                self.calls += 1
                if self.calls == self.config.lose_at_call and not LostOnce.lost:
                    LostOnce.lost = True
                    raise GenerationUnavailable("The test generator stopped answering.")
                return super().generate(prompt_ids, with_logprobs)

        @grpo_kit.hookimpl
        def register_generations(register):
            register("lost_once", LostOnce, LostConfig, samples_from_policy=True)  # as transformers is registered

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("digits", lambda completions, **_: [sum(map(str.isdigit, t)) / (len(t) or 1) for t in completions])
    """,
    )
    from grpo_kit.contract.errors import GenerationUnavailable
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[module]))
    settings = tiny_run(
        tiny_model,
        "+reward=digits",
        "generation=lost_once",
        "trainer.max_steps=4",
        "trainer.save_steps=100",
        "trainer.gradient_accumulation_steps=2",
        "algorithm.steps_per_generation=1",
        "trainer.per_device_train_batch_size=4",
    )
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    grpo_kit.train(grpo_kit.compose(settings, registry), unbroken, registry)
    with pytest.raises(GenerationUnavailable, match=r"A checkpoint of step 2 is saved.*\n.*trainer.resume=auto"):
        grpo_kit.train(grpo_kit.compose([*settings, "generation.lose_at_call=6"], registry), broken, registry)
    assert sorted(path.name for path in (broken / "checkpoints").iterdir()) == ["step-000002"]
    resumed = grpo_kit.compose([*settings, "generation.lose_at_call=6", "trainer.resume=auto"], registry)
    grpo_kit.train(resumed, broken, registry)  # it is lost only once
    assert_same_weights(broken, unbroken)
