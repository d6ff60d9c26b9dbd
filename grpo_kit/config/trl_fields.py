"""Every field of TRL 1.16's `GRPOConfig` (its TrainingArguments included), and what it becomes in grpo_kit.

Data, read by `grpo-kit from-trl` and `python -m grpo_kit --trl-config` (grpo_kit/config/trl_recipe.py) and printed
as docs/trl.md's table. tests/test_trl_fields.py fails when the installed GRPOConfig has a field this table lacks,
so a new TRL field shows up as unmapped rather than passing unnoticed.
"""

from grpo_kit.config import trl_rewards as rewards
from grpo_kit.config import trl_translations as t
from grpo_kit.config import trl_vllm as vllm
from grpo_kit.config.trl_entries import Mapped, NotApplicable, Refused, same

LAUNCHER = "accelerate launch --config_file conf/accelerate/NAME.yaml (docs/scaling.md)"
NO_DATALOADER = "grpo_kit has no DataLoader: the sampler plugin draws each generation batch's prompts in the process"
NO_PREDICTIONS = "GRPO's evaluation generates and scores completions; there are no predictions or compute_metrics"
LIGER = (
    "in TRL 1.16 it is deprecated, and it only has transformers patch the model's layers (norms, rotary "
    "embeddings, MLPs) with Liger's Triton kernels, with Liger's fused cross-entropy turned off so that TRL's own "
    "chunked LM head computes the log-probs; grpo_kit patches no layer kernels"
)
LIGER_NEAREST = (
    "model.logits=chunked (TRL's chunked head); model.logits=liger is Liger's fused GRPO loss, another thing"
)
CLIPPED = t.CLIPPED_LOSSES

TRAINING = {
    "output_dir": Mapped("hydra.run.dir", lambda value, recipe: {"hydra.run.dir": value}),
    "per_device_train_batch_size": same("trainer.per_device_train_batch_size", "completions per micro-batch"),
    "num_train_epochs": same("trainer.num_train_epochs"),
    "max_steps": same("trainer.max_steps"),
    "learning_rate": same("trainer.learning_rate"),
    "lr_scheduler_type": same("trainer.lr_scheduler_type"),
    "lr_scheduler_kwargs": same("trainer.lr_scheduler_kwargs"),
    "warmup_steps": same("trainer.warmup_steps"),
    "optim": same("trainer.optim"),
    "optim_args": same("trainer.optim_args"),
    "weight_decay": same("trainer.weight_decay"),
    "adam_beta1": same("trainer.adam_beta1"),
    "adam_beta2": same("trainer.adam_beta2"),
    "adam_epsilon": same("trainer.adam_epsilon"),
    "optim_target_modules": Refused("no GaLore or APOLLO optimizer", "trainer.optim", None),
    "gradient_accumulation_steps": same("trainer.gradient_accumulation_steps"),
    "average_tokens_across_devices": NotApplicable(
        "transformers' token count for language-model losses; GRPO's loss plugins divide by their own normalisers"
    ),
    "max_grad_norm": same("trainer.max_grad_norm"),
    "label_smoothing_factor": NotApplicable("a cross-entropy setting; GRPO's loss has no labels to smooth"),
    "bf16": Mapped("trainer.mixed_precision", t.bf16, "true: bf16; unset: model=hf's auto (bf16 on a GPU that has it)"),
    "fp16": Mapped("trainer.mixed_precision", t.fp16, "true: fp16"),
    "bf16_full_eval": Refused("evaluation runs in the training precision", "trainer.mixed_precision", False),
    "fp16_full_eval": Refused("evaluation runs in the training precision", "trainer.mixed_precision", False),
    "tf32": Mapped("trainer.tf32"),
    "activation_checkpointing": Mapped("model.gradient_checkpointing", t.checkpointing, "transformers 5's new name"),
    "activation_checkpointing_kwargs": Mapped("trainer.gradient_checkpointing_kwargs", t.checkpointing_kwargs),
    "gradient_checkpointing": Mapped("model.gradient_checkpointing", t.checkpointing),
    "gradient_checkpointing_kwargs": Mapped("trainer.gradient_checkpointing_kwargs", t.checkpointing_kwargs),
    "torch_compile": same("trainer.torch_compile"),
    "torch_compile_backend": Mapped(
        "trainer.torch_compile_backend", t.compile_option("trainer.torch_compile_backend"), "also torch_compile=true"
    ),
    "torch_compile_mode": Mapped(
        "trainer.torch_compile_mode", t.compile_option("trainer.torch_compile_mode"), "also torch_compile=true"
    ),
    "use_liger_kernel": Refused(LIGER, LIGER_NEAREST, False),
    "liger_kernel_config": Refused(LIGER, LIGER_NEAREST, None),
    "use_cache": NotApplicable("training passes never keep a KV cache; generation backends keep their own"),
    "neftune_noise_alpha": Refused("no noise on the embeddings", "none", None),
    "torch_empty_cache_steps": Mapped("trainer.torch_empty_cache_steps"),
    "auto_find_batch_size": Refused("no batch-size search", "trainer.max_tokens_per_micro_batch", False),
}

LOGGING = {
    "logging_strategy": Mapped("trainer.logging_steps", t.logging_strategy, "steps only"),
    "logging_steps": Mapped("trainer.logging_steps", t.whole_steps("trainer.logging_steps"), "whole steps only"),
    "logging_first_step": Mapped("trainer.logging_first_step"),
    "log_on_each_node": NotApplicable("only the main process logs, on any number of nodes"),
    "logging_nan_inf_filter": NotApplicable(
        "grpo_kit logs a non-finite loss as it is, and stops after trainer.max_bad_steps of them in a row"
    ),
    "include_num_input_tokens_seen": Refused("no count of input tokens", "none", "no"),
    "log_level": NotApplicable("grpo_kit logs at INFO through Hydra's job logging (hydra.verbose=true: DEBUG)"),
    "log_level_replica": NotApplicable("only the main process logs"),
    "disable_tqdm": Mapped("trainer.progress_bar", t.disable_tqdm, "the opposite"),
    "report_to": Mapped("trainer.report_to", t.report_to, "tensorboard, wandb, trackio; none: []"),
    "run_name": same("trainer.run_name"),
    "project": same("trainer.project"),
    "trackio_space_id": Refused("trackio logs locally only", "trainer.report_to=[trackio]", None),
    "trackio_bucket_id": Refused("trackio logs locally only", "trainer.report_to=[trackio]", None),
    "trackio_static_space_id": Refused("trackio logs locally only", "trainer.report_to=[trackio]", None),
    "log_completions": same("trainer.log_completions"),
    "log_multimodal": NotApplicable("the completion tables show each image of a prompt as [image]"),
    "num_completions_to_print": same("trainer.num_completions_to_print"),
    "log_unique_prompts": same("trainer.log_unique_prompts"),
    "log_completions_hub_repo": Refused(
        "completion tables go to the trackers and samples.jsonl, not to a Hub dataset", "trainer.log_completions", None
    ),
}

EVALUATION = {
    "eval_strategy": Mapped("eval.split, eval.steps", t.eval_strategy, "steps: dataset_test_split every eval_steps"),
    "eval_steps": Mapped("eval.steps", t.read_with_eval_strategy, "read with eval_strategy"),
    "eval_delay": Refused("evaluation starts with the run", "eval.steps", 0),
    "per_device_eval_batch_size": NotApplicable(
        "memory per evaluation pass only; eval.batch_size (prompts per generate call) is grpo_kit's knob"
    ),
    "prediction_loss_only": NotApplicable(NO_PREDICTIONS),
    "eval_on_start": same("eval.on_start"),
    "eval_do_concat_batches": NotApplicable(NO_PREDICTIONS),
    "eval_use_gather_object": NotApplicable(NO_PREDICTIONS),
    "eval_accumulation_steps": NotApplicable(NO_PREDICTIONS),
    "include_for_metrics": NotApplicable(NO_PREDICTIONS),
    "batch_eval_metrics": NotApplicable(NO_PREDICTIONS),
    "load_best_model_at_end": same("trainer.load_best_model_at_end"),
    "metric_for_best_model": Mapped(
        "trainer.metric_for_best_model", t.metric_for_best_model, "eval_NAME or NAME becomes eval/NAME"
    ),
    "greater_is_better": same("trainer.greater_is_better"),
}

SAVING = {
    "save_only_model": same("trainer.save_only_model"),
    "save_strategy": Mapped("trainer.save_steps", t.save_strategy, "steps; no: only the final model"),
    "save_steps": Mapped("trainer.save_steps", t.save_steps, "whole steps only"),
    "save_on_each_node": Refused("only the main process saves", "none", False),
    "save_total_limit": Mapped("trainer.save_total_limit", t.save_total_limit, "grpo_kit's default keeps 2"),
    "enable_jit_checkpoint": NotApplicable("grpo_kit always saves a checkpoint when a signal stops the run"),
    "push_to_hub": same("trainer.push_to_hub"),
    "hub_token": Refused(
        "a token written in a recipe would be copied into the printed command and the experiment file; "
        "log in instead (`hf auth login` or HF_TOKEN)",
        "trainer.hub_token='${oc.env:HF_TOKEN}'",
        None,
    ),
    "hub_private_repo": same("trainer.hub_private_repo"),
    "hub_model_id": same("trainer.hub_model_id"),
    "hub_strategy": same("trainer.hub_strategy", "all_checkpoints is refused: docs/hub.md"),
    "hub_always_push": same("trainer.hub_always_push"),
    "hub_revision": same("trainer.hub_revision", "a missing branch is created"),
    "ignore_data_skip": Refused("a resumed run always continues the prompts where it stopped", "none", False),
    "restore_callback_states_from_checkpoint": NotApplicable("no callbacks: hooks keep their state in TrainState"),
    "resume_from_checkpoint": Mapped("trainer.resume", t.resume_from_checkpoint, "true: auto"),
}

RUNTIME = {
    "full_determinism": Refused("no deterministic-algorithms switch", "seed", False),
    "seed": same("seed"),
    "data_seed": Refused("the prompt order follows the run's seed", "seed", None),
    "use_cpu": Refused("grpo_kit takes the GPU when there is one", "CUDA_VISIBLE_DEVICES= (none visible)", False),
    "accelerator_config": Refused("accelerate is configured by its launcher", LAUNCHER, None),
    "parallelism_config": Refused("accelerate is configured by its launcher", LAUNCHER, None),
    "dataloader_drop_last": NotApplicable(NO_DATALOADER),
    "dataloader_num_workers": NotApplicable(NO_DATALOADER),
    "dataloader_pin_memory": NotApplicable(NO_DATALOADER),
    "dataloader_persistent_workers": NotApplicable(NO_DATALOADER),
    "dataloader_prefetch_factor": NotApplicable(NO_DATALOADER),
    "dataloader_multiprocessing_context": NotApplicable(NO_DATALOADER),
    "dataloader_in_order": NotApplicable(NO_DATALOADER),
    "remove_unused_columns": NotApplicable("every column reaches the rewards, as TRL's GRPO default (false) does"),
    "label_names": NotApplicable("GRPO has no labels"),
    "train_sampling_strategy": Mapped("data.shuffle", t.train_sampling_strategy, "random; sequential: shuffle=false"),
    "length_column_name": NotApplicable("read only by samplers grpo_kit refuses (train_sampling_strategy)"),
    "ddp_find_unused_parameters": Refused("DDP is configured by its launcher", LAUNCHER, None),
    "ddp_bucket_cap_mb": Refused("DDP is configured by its launcher", LAUNCHER, None),
    "ddp_broadcast_buffers": Refused("DDP is configured by its launcher", LAUNCHER, None),
    "ddp_static_graph": Refused("DDP is configured by its launcher", LAUNCHER, None),
    "ddp_backend": Refused("DDP is configured by its launcher", LAUNCHER, None),
    "ddp_timeout": Mapped("trainer.ddp_timeout"),
    "fsdp": Refused("sharding is chosen by the launcher's config", "conf/accelerate/fsdp2.yaml", None),
    "fsdp_config": Refused("sharding is chosen by the launcher's config", "conf/accelerate/fsdp2.yaml", None),
    "deepspeed": Refused("DeepSpeed is chosen by the launcher's config", "conf/accelerate/deepspeed_zero3.yaml", None),
    "debug": Refused("no transformers debug features", "none", ""),
    "skip_memory_metrics": NotApplicable("grpo_kit reports no memory profiler metrics"),
    "do_train": NotApplicable("read by training scripts, not by the trainer; grpo_kit always trains"),
    "do_eval": NotApplicable("read by training scripts, not by the trainer; eval_strategy decides"),
    "do_predict": NotApplicable("read by training scripts, not by the trainer"),
    "local_rank": NotApplicable("set by the launcher for each process"),
}

MODEL = {
    "model_init_kwargs": Mapped("model.model_init_kwargs", lambda v, r: {"model.model_init_kwargs": dict(v or {})}),
    "trust_remote_code": same("model.trust_remote_code"),
    "router_aux_loss_coef": same("algorithm.router_aux_loss_coef"),
    "disable_dropout": same("model.disable_dropout"),
    "cast_lm_head_to_fp32": same("model.cast_lm_head_to_fp32"),
    "pad_to_multiple_of": Mapped("model.pad_to_multiple_of", t.pad_to_multiple_of, "auto: grpo_kit's own auto"),
    "chat_template_kwargs": same("data.chat_template_kwargs"),
    "shuffle_dataset": same("data.shuffle"),
}

GENERATION = {
    "num_generations": same("generation.num_generations"),
    "num_generations_eval": same("eval.num_generations"),
    "max_completion_length": same("generation.max_completion_length"),
    "ds3_gather_for_generation": same("generation.ds3_gather_for_generation"),
    "generation_batch_size": same("generation.batch_size"),
    "steps_per_generation": same("algorithm.steps_per_generation"),
    "temperature": same("generation.temperature"),
    "top_p": same("generation.top_p"),
    "top_k": Mapped("generation.top_k", t.top_k, "0: null"),
    "min_p": same("generation.min_p"),
    "generation_kwargs": same("generation.generation_kwargs"),
    "repetition_penalty": same("generation.repetition_penalty"),
    "cache_implementation": same("generation.cache_implementation"),
    "use_transformers_continuous_batching": Refused(
        "no continuous batching in the transformers backend", "generation.loop=lean", False
    ),
    "transformers_continuous_batching_config": Refused(
        "no continuous batching in the transformers backend", "generation.loop=lean", None
    ),
    "use_transformers_paged": Refused("no paged generation in the transformers backend", "generation.loop=lean", False),
}

VLLM = {
    "use_vllm": Mapped("generation", vllm.use_vllm, "vllm_server or vllm_colocate, by vllm_mode"),
    "vllm_mode": Mapped("generation", vllm.read_with_use_vllm, "read with use_vllm"),
    "vllm_model_impl": Refused("vLLM runs its own model implementation", "none", "vllm"),
    "vllm_enable_sleep_mode": Mapped(
        "generation.sleep_level", vllm.in_mode("colocate", "generation.sleep_level", False, vllm.sleep_level), "2"
    ),
    "vllm_structured_outputs_regex": Mapped(
        "generation.structured_outputs_regex", vllm.structured_outputs_regex, "with use_vllm only"
    ),
    "vllm_server_base_url": Mapped("generation.base_url", vllm.server_address(None)),
    "vllm_server_host": Mapped("generation.base_url", vllm.server_address("0.0.0.0"), "http://HOST:PORT"),
    "vllm_server_port": Mapped("generation.base_url", vllm.server_address(8000), "http://HOST:PORT"),
    "vllm_server_timeout": Mapped(
        "generation.connect_timeout", vllm.in_mode("server", "generation.connect_timeout", 240.0)
    ),
    "vllm_group_port": Refused(
        "the weights reach the server through its own transport", "generation.weight_sync_port", 51216
    ),
    "vllm_gpu_memory_utilization": Mapped(
        "generation.gpu_memory_utilization", vllm.in_mode("colocate", "generation.gpu_memory_utilization", 0.3)
    ),
    "vllm_max_model_length": Mapped(
        "generation.max_model_len", vllm.in_mode("colocate", "generation.max_model_len", None)
    ),
    "vllm_tensor_parallel_size": Mapped(
        "generation.tensor_parallel_size", vllm.in_mode("colocate", "generation.tensor_parallel_size", 1)
    ),
}

OBJECTIVE = {
    "beta": same("algorithm.beta"),
    "num_iterations": same("algorithm.num_iterations"),
    "epsilon": Mapped("loss.epsilon", t.loss_option("epsilon", CLIPPED, 0.2)),
    "delta": Mapped("loss.delta", t.loss_option("delta", CLIPPED, None)),
    "epsilon_high": Mapped("loss.epsilon_high", t.loss_option("epsilon_high", (*CLIPPED, "cispo"), None)),
    "sapo_temperature_neg": Mapped("loss.temperature_neg", t.loss_option("temperature_neg", ("sapo",), 1.05)),
    "sapo_temperature_pos": Mapped("loss.temperature_pos", t.loss_option("temperature_pos", ("sapo",), 1.0)),
    "vespo_k_pos": Mapped("loss.k_pos", t.loss_option("k_pos", ("vespo",), 2.0)),
    "vespo_lambda_pos": Mapped("loss.lambda_pos", t.loss_option("lambda_pos", ("vespo",), 3.0)),
    "vespo_k_neg": Mapped("loss.k_neg", t.loss_option("k_neg", ("vespo",), 3.0)),
    "vespo_lambda_neg": Mapped("loss.lambda_neg", t.loss_option("lambda_neg", ("vespo",), 2.0)),
    "importance_sampling_level": Mapped("importance_sampling", lambda value, recipe: {"importance_sampling": value}),
    "reward_weights": Mapped("reward.NAME.weight", rewards.reward_weights, "in reward_funcs' order"),
    "multi_objective_aggregation": Mapped(
        "advantage", t.multi_objective_aggregation, "normalize_then_sum: advantage=gdpo"
    ),
    "scale_rewards": Mapped("advantage", t.scale_rewards, "group, batch or none: one advantage plugin each"),
    "loss_type": Mapped("loss", t.loss_type),
    "mask_truncated_completions": same("algorithm.mask_truncated_completions"),
    "sync_ref_model": same("algorithm.sync_ref_model"),
    "ref_model_mixup_alpha": same("algorithm.ref_model_mixup_alpha"),
    "ref_model_sync_steps": same("algorithm.ref_model_sync_steps"),
    "top_entropy_quantile": same("algorithm.top_entropy_quantile"),
    "entropy_coef": same("algorithm.entropy_coef"),
    "use_adaptive_entropy": same("algorithm.use_adaptive_entropy"),
    "entropy_coef_min": same("algorithm.entropy_coef_min"),
    "entropy_coef_max": same("algorithm.entropy_coef_max"),
    "entropy_coef_delta": same("algorithm.entropy_coef_delta"),
    "entropy_target": same("algorithm.entropy_target"),
    "max_tool_calling_iterations": same("algorithm.max_tool_calling_iterations"),
    "vllm_importance_sampling_correction": Mapped(
        "rollout_correction", t.correction_choice, "false: rollout_correction=none"
    ),
    "vllm_importance_sampling_mode": Mapped("rollout_correction", t.correction_option("rollout_correction")),
    "vllm_importance_sampling_clip_max": Mapped(
        "rollout_correction.max", t.correction_option("rollout_correction.max")
    ),
    "vllm_importance_sampling_clip_min": Mapped(
        "rollout_correction.min", t.correction_option("rollout_correction.min")
    ),
    "vllm_importance_sampling_cap": Mapped("rollout_correction.max", t.capped, "deprecated: clip_max"),
    "off_policy_mask_threshold": same("algorithm.off_policy_mask_threshold"),
    "use_bias_correction_kl": same("algorithm.use_bias_correction_kl"),
}

GRPO_CONFIG_FIELDS = {**TRAINING, **LOGGING, **EVALUATION, **SAVING, **RUNTIME, **MODEL, **GENERATION, **VLLM}
GRPO_CONFIG_FIELDS |= OBJECTIVE
