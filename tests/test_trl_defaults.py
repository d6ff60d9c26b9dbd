"""model=hf and data=hf carry TRL 1.16's GRPOConfig defaults: each mapped default is read from a real
`trl.GRPOConfig()`, so a preset and TRL cannot drift apart unnoticed."""

import json
import logging

import pytest
from omegaconf import OmegaConf

import grpo_kit
from grpo_kit.config.compatibility import corrects_rollouts
from grpo_kit.model.precision import resolve_mixed_precision
from grpo_kit.testing import tiny_run

# TRL's field -> our key, with the same default.
SAME = {
    "learning_rate": "trainer.learning_rate",
    "max_steps": "trainer.max_steps",
    "num_train_epochs": "trainer.num_train_epochs",
    "per_device_train_batch_size": "trainer.per_device_train_batch_size",
    "gradient_accumulation_steps": "trainer.gradient_accumulation_steps",
    "lr_scheduler_type": "trainer.lr_scheduler_type",
    "weight_decay": "trainer.weight_decay",
    "adam_beta1": "trainer.adam_beta1",
    "adam_beta2": "trainer.adam_beta2",
    "adam_epsilon": "trainer.adam_epsilon",
    "max_grad_norm": "trainer.max_grad_norm",
    "warmup_steps": "trainer.warmup_steps",
    "lr_scheduler_kwargs": "trainer.lr_scheduler_kwargs",
    "optim": "trainer.optim",
    "optim_args": "trainer.optim_args",
    "save_only_model": "trainer.save_only_model",
    "run_name": "trainer.run_name",
    "logging_steps": "trainer.logging_steps",
    "save_steps": "trainer.save_steps",
    "report_to": "trainer.report_to",
    "gradient_checkpointing_kwargs": "trainer.gradient_checkpointing_kwargs",
    "seed": "seed",
    "shuffle_dataset": "data.shuffle",
    "chat_template_kwargs": "data.chat_template_kwargs",
    "model_init_kwargs": "model.model_init_kwargs",
    "trust_remote_code": "model.trust_remote_code",
    "disable_dropout": "model.disable_dropout",
    "cast_lm_head_to_fp32": "model.cast_lm_head_to_fp32",
    "num_generations": "generation.num_generations",
    "max_completion_length": "generation.max_completion_length",
    "temperature": "generation.temperature",
    "top_p": "generation.top_p",
    "min_p": "generation.min_p",
    "repetition_penalty": "generation.repetition_penalty",
    "generation_kwargs": "generation.generation_kwargs",
    "cache_implementation": "generation.cache_implementation",
    "ds3_gather_for_generation": "generation.ds3_gather_for_generation",
    "loss_type": "loss.name",
    "epsilon": "loss.epsilon",
    "epsilon_high": "loss.epsilon_high",
    "delta": "loss.delta",
    "importance_sampling_level": "importance_sampling.name",
    "scale_rewards": "advantage.name",  # group / batch / none: one advantage plugin each
    "vllm_importance_sampling_mode": "rollout_correction.name",
    "vllm_importance_sampling_clip_min": "rollout_correction.min",
    "vllm_importance_sampling_clip_max": "rollout_correction.max",
    "beta": "algorithm.beta",
    "use_bias_correction_kl": "algorithm.use_bias_correction_kl",
    "top_entropy_quantile": "algorithm.top_entropy_quantile",
    "entropy_coef": "algorithm.entropy_coef",
    "use_adaptive_entropy": "algorithm.use_adaptive_entropy",
    "entropy_coef_min": "algorithm.entropy_coef_min",
    "entropy_coef_max": "algorithm.entropy_coef_max",
    "entropy_coef_delta": "algorithm.entropy_coef_delta",
    "entropy_target": "algorithm.entropy_target",
    "router_aux_loss_coef": "algorithm.router_aux_loss_coef",
    "off_policy_mask_threshold": "algorithm.off_policy_mask_threshold",
    "num_iterations": "algorithm.num_iterations",
    "mask_truncated_completions": "algorithm.mask_truncated_completions",
    "sync_ref_model": "algorithm.sync_ref_model",
    "ref_model_mixup_alpha": "algorithm.ref_model_mixup_alpha",
    "ref_model_sync_steps": "algorithm.ref_model_sync_steps",
    "max_tool_calling_iterations": "algorithm.max_tool_calling_iterations",
    "eval_on_start": "eval.on_start",
    "num_generations_eval": "eval.num_generations",
}

# TRL's field -> (our key, TRL's default in our terms, why the spelling differs).
TRANSLATED = {
    "gradient_checkpointing": ("model.gradient_checkpointing", "auto", "on wherever the model supports it"),
    "bf16": ("trainer.mixed_precision", "auto", "bf16 on a GPU that has it; float32 on a CPU, where TRL refuses it"),
    "vllm_importance_sampling_correction": (
        "algorithm.correct_policy_sampler",
        False,
        "the correction applies to vLLM's samples, not to the policy's own",
    ),
    "top_k": ("generation.top_k", None, "TRL's 0 and our null both keep every token"),
    "steps_per_generation": ("algorithm.steps_per_generation", None, "null: gradient_accumulation_steps, as TRL sets"),
    "disable_tqdm": ("trainer.progress_bar", True, "the progress bar is shown"),
    "eval_strategy": ("eval.split", None, "no eval set named: no evaluation"),
    "multi_objective_aggregation": ("advantage.name", "group", "sum_then_normalize: the weighted sum, normalised"),
}

# TRL's field -> why our preset deliberately differs.
DIFFERENT = {
    "save_total_limit": "TRL keeps every checkpoint; trainer.save_total_limit keeps the newest 2 of a real model's "
    "multi-gigabyte checkpoints (set it higher to keep more).",
    "project": "the trackers' project is named after this toolkit (grpo_kit), TRL's after Hugging Face",
}


@pytest.fixture(scope="module")
def trl_defaults(trl, tmp_path_factory):
    # use_cpu: without it, GRPOConfig() refuses its own bf16 default on a machine with no bf16 GPU; it changes
    # no other default.
    return trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), use_cpu=True)


@pytest.fixture(scope="module")
def presets():
    return grpo_kit.compose(["model.name_or_path=x", "data.path=y", "+reward=accuracy"])


@pytest.mark.parametrize("field", SAME)
def test_a_default_is_trls(trl_defaults, presets, field):
    assert OmegaConf.select(presets, SAME[field]) == getattr(trl_defaults, field), SAME[field]


@pytest.mark.parametrize("field", TRANSLATED)
def test_a_translated_default_says_what_trls_says(trl_defaults, presets, field):
    key, ours, _ = TRANSLATED[field]
    expected_trl = {
        "gradient_checkpointing": True,
        "bf16": True,
        "vllm_importance_sampling_correction": True,
        "top_k": 0,
        "steps_per_generation": trl_defaults.gradient_accumulation_steps,
        "disable_tqdm": False,
        "eval_strategy": "no",
        "multi_objective_aggregation": "sum_then_normalize",
    }[field]
    assert getattr(trl_defaults, field) == expected_trl, f"TRL's {field} changed: map it again"
    assert OmegaConf.select(presets, key) == ours, key


def test_deliberate_differences_are_still_differences(trl_defaults, presets):
    assert trl_defaults.save_total_limit is None and presets.trainer.save_total_limit == 2
    assert trl_defaults.project == "huggingface" and presets.trainer.project == "grpo_kit"
    assert set(DIFFERENT) == {"save_total_limit", "project"}


def test_trl_computes_log_probs_through_a_chunked_head(presets, trl):
    # TRL 1.16 always replaces the LM head's forward by its fused, chunked one (no GRPOConfig field turns it off).
    from trl.trainer import grpo_trainer

    assert hasattr(grpo_trainer, "add_fused_lm_head")
    assert presets.model.logits == "chunked"


def test_naming_only_the_model_keeps_the_embedded_tasks_lengths():
    cfg = grpo_kit.compose(["model.name_or_path=x", "+reward=accuracy"])
    assert cfg.generation.max_completion_length == 4 and cfg.trainer.max_steps == -1


def test_the_rollout_correction_applies_to_vllm_samples_only(registry, presets):
    vllm = grpo_kit.compose(
        ["model.name_or_path=x", "data.path=y", "+reward=accuracy", "generation=vllm_server"], registry
    )
    assert corrects_rollouts(vllm, registry)
    assert not corrects_rollouts(presets, registry)
    own_choice = grpo_kit.compose(["+reward=accuracy", "rollout_correction=token_truncate"], registry)
    assert corrects_rollouts(own_choice, registry)  # the embedded default corrects the policy's samples when asked


def test_vespo_is_refused_only_where_the_sequence_correction_applies(registry):
    base = ["model.name_or_path=x", "data.path=y", "+reward=accuracy", "+loss=vespo"]
    grpo_kit.compose(base, registry)  # the transformers backend: no correction, nothing to refuse
    with pytest.raises(grpo_kit.contract.errors.ConfigError, match="token-level rollout corrections"):
        grpo_kit.compose([*base, "generation=vllm_server"], registry)


def metric_names(run_dir) -> set[str]:
    return {name for line in (run_dir / "metrics.jsonl").read_text().splitlines() for name in json.loads(line)}


def test_model_hf_trains_the_policys_own_samples_uncorrected(registry, tiny_model, tmp_path, caplog):
    overrides = tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1", "trainer.save_model=false")
    caplog.set_level(logging.INFO)
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "hf", registry)
    assert "rollout_correction=sequence_mask is off: generation=transformers samples" in caplog.text
    assert not any(name.startswith("sampling/") for name in metric_names(tmp_path / "hf"))

    corrected = grpo_kit.compose([*overrides, "algorithm.correct_policy_sampler=true"], registry)
    grpo_kit.train(corrected, tmp_path / "corrected", registry)
    assert "sampling/importance_sampling_ratio/mean" in metric_names(tmp_path / "corrected")


def test_auto_precision_is_float32_without_a_bf16_gpu(caplog):
    caplog.set_level(logging.INFO)
    expected = "bf16" if torch_has_bf16_gpu() else "no"
    assert resolve_mixed_precision("auto") == expected
    assert f"trainer.mixed_precision=auto: {expected}" in caplog.text
    assert resolve_mixed_precision("fp16") == "fp16"


def torch_has_bf16_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
