"""Which passes run with dropout: as in TRL 1.16, the policy stays in training mode from generation to its
optimizer step, so that its samples, its old log-probs and a LoRA policy's reference log-probs (the adapters off)
all come from training-mode passes, as its trained log-probs do. Evaluation runs in eval mode.

The model's attention dropout is 1.0: it drops every attention weight, so a training-mode pass is deterministic
(attention contributes nothing) and differs from an eval-mode pass by far more than rounding.
"""

import json

import grpo_kit
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import build_tiny_model, tiny_run

LOG_RATIO_PROBE = """
    import grpo_kit
    from grpo_kit.contract.reductions import sequence_mean

    class LogRatioProbe:
        '''A policy gradient that reports how far the old log-probs are from the trained ones.'''

        def per_token_loss(self, inputs):
            largest = (inputs.log_ratio * inputs.mask).abs().max()
            return -inputs.advantages * inputs.per_token_logps, {"probe/max_abs_log_ratio": largest}

        def reduce(self, per_token_loss, mask, reduction):
            return sequence_mean(per_token_loss, mask, reduction)

    @grpo_kit.hookimpl
    def register_losses(register):
        register("log_ratio_probe", LogRatioProbe)
"""


def test_samples_old_and_reference_log_probs_come_from_training_mode_passes(local_plugin, tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", attention_dropout=1.0)
    registry = Registry(plugin_manager(local_modules=[local_plugin("log_ratio_probe", LOG_RATIO_PROBE)]))
    cfg = grpo_kit.compose(
        tiny_run(
            model_dir,
            "+loss=log_ratio_probe",
            "+reward=accuracy",
            "trainer.learning_rate=0",  # the policy never moves: its old log-probs must equal its trained ones
            "trainer.per_device_train_batch_size=4",
            "algorithm.steps_per_generation=2",  # the second micro-batch's old log-probs are computed at generation
            "trainer.max_steps=2",
            "model.lora.enabled=true",  # its reference is the policy itself with the adapters off, equal at the start
            "algorithm.beta=0.04",
            "rollout_correction=token_truncate",  # so that the sampler's log-probs are compared with the old ones
            "algorithm.correct_policy_sampler=true",
        ),
        registry,
    )
    grpo_kit.train(cfg, tmp_path / "run", registry)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert line["probe/max_abs_log_ratio"] < 1e-6, line  # old log-probs: training mode, as the trained ones
        assert abs(line["kl"]) < 1e-6, line  # the adapter-free reference: training mode too
        assert line["sampling/sampling_logp_difference/max"] < 1e-4, line  # generation: training mode too
