"""The run's configuration as plain dataclasses: its sections, the plugin each kind defaults to, and the node a
plugin's config dataclass becomes.

No Hydra here: a module that needs a section's type imports it from this module, not from the one that composes a
run with Hydra (grpo_kit/config/compose.py).
"""

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

# grpo_kit/contract/secrets.py's metadata key of a secret option, spelt out: importing it would load grpo_kit, and
# Hydra with it, into whatever loads this schema (tests/test_hub.py fails if the token then reaches a file).
SECRET = "grpo_kit.secret"


# The choices a run makes when the command line makes none (TRL's defaults, and DAPO's loss). They are names in
# the config, not imports: a default whose plugin is not installed is left unselected.
DEFAULT_CHOICES = {
    "loss": "dapo",
    "importance_sampling": "token",
    "rollout_correction": "none",
    "advantage": "group",
    "generation": "transformers",
    "sampler": "uniform",
}


@dataclass
class LoraConfig:
    """PEFT LoRA (Hu et al. 2021, https://arxiv.org/abs/2106.09685): train low-rank updates of the weights only.

    With LoRA the reference model of the KL term is the frozen base model itself (the adapters turned off), so no
    copy of the model is kept.
    """

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: Any = "all-linear"  # module names, or PEFT's "all-linear": every linear layer but the head


@dataclass
class ModelConfig:
    name_or_path: str | None = None  # a hub id or a local folder; None builds the embedded tiny model
    # A dict for from_pretrained: model.model_init_kwargs={dtype:bfloat16}. `Any`, not `dict`: Hydra
    # rejects new keys in a typed dict, and these keys are free.
    model_init_kwargs: Any = None
    # Run the model's and its tokenizer's own code from the hub (and the reward model's, unless its reward says
    # otherwise): only for a repository you trust.
    trust_remote_code: bool = False
    disable_dropout: bool = False  # every dropout off: the same input then always gets the same log-probs
    cast_lm_head_to_fp32: bool = False  # ScaleRL (arXiv 2510.13786): logits in float32; untied heads only
    # Recompute activations in the backward pass: less memory, more time (trainer.gradient_checkpointing_kwargs
    # tunes it). true, false, or auto: on where the model supports it, which the log says.
    gradient_checkpointing: Any = False
    # Large vocabularies (docs/training.md): full materialises the (B, T, V) logits; chunked never does (log-probs
    # from the last hidden states, logits_chunk_size positions at a time); tiled holds no more than a tile of
    # logits_chunk_size positions x logits_vocab_tile columns; liger uses liger-kernel's fused linear GRPO loss where
    # it equals the plain loss (pip install 'grpo-kit[liger]'), else chunked. Not TRL's use_liger_kernel, which
    # patches the model's layer kernels instead (docs/trl.md).
    logits: str = "full"
    logits_chunk_size: int = 1024  # positions whose logits exist at once (chunked, tiled, and liger's metrics)
    logits_vocab_tile: int = 32768  # vocabulary columns of a tile (tiled)
    # Speed-ups of the forward passes (docs/training.md, "Speed-ups"), each where it applies and giving the plain
    # pass's values up to float rounding; false takes the plain pass, to compare or to rule one out.
    mask_free_passes: bool = True  # no attention mask where each row's tokens are one span: rows moved left
    # A micro-batch of mixed completion lengths as two passes, each cut to its longest: true, false, or auto (on, but
    # on a CUDA GPU, where each pass's shape costs kernel plans). `Any`: a boolean or "auto".
    passes_by_length: Any = "auto"
    cpu_chunked_attention: bool = True  # a CPU model's SDPA causal attention in chunks of 64 queries
    # Each training pass's width (prompt + completion columns) rounded up to a multiple of this many tokens, so that a
    # GPU sees few shapes (TRL's pad_to_multiple_of): a number, null, or auto (64 on a CUDA GPU, none elsewhere).
    pad_to_multiple_of: Any = "auto"
    lora: LoraConfig = field(default_factory=LoraConfig)
    # A vision-language model's image encoder (docs/vision.md): true trains it (LoRA: adapters on it too), false
    # keeps it as loaded; auto trains it in full fine-tuning (as TRL does) and keeps it under LoRA.
    train_vision_tower: Any = "auto"
    embedded: str = "sums"  # which embedded model name_or_path=null builds: sums, tool_use (calls a calculator), vision


@dataclass
class DataConfig:
    path: str | None = None  # json/jsonl/parquet/csv file, or a hub dataset; None generates the embedded task
    name: str | None = None  # the hub dataset's configuration
    split: str = "train"
    shuffle: bool = True  # false: the dataset's own order, epoch after epoch (TRL's shuffle_dataset)
    # Extra variables for the tokenizer's chat template, wherever a chat prompt is rendered (training, evaluation,
    # tool turns): data.chat_template_kwargs={enable_thinking:false} for Qwen3. `Any`: its keys are free.
    chat_template_kwargs: Any = None
    num_examples: int = 2000  # size of the embedded task
    # Which embedded task path=null generates: sums, tool_use (2-digit sums as chat) or vision (counting squares).
    embedded: str = "sums"


@dataclass
class AlgorithmConfig:
    """The objective's settings that belong to no single plugin (TRL's defaults)."""

    beta: float = 0.0  # weight of the k3 KL to a reference model, which is loaded only when beta > 0
    use_bias_correction_kl: bool = True  # KL times the importance weight (DeepSeek-V3.2, arXiv 2512.02556)
    top_entropy_quantile: float = 1.0  # train only the top share of tokens by entropy (arXiv 2506.01939: 0.2)
    entropy_coef: float = 0.0  # entropy bonus: the loss minus entropy_coef x the mean entropy
    # Skywork-OR1's adaptive entropy control (arXiv 2505.22312): entropy_coef moves by entropy_coef_delta each
    # optimizer step, up while the step's mean entropy is at or below entropy_target, down otherwise, within
    # [entropy_coef_min, entropy_coef_max]; the bonus applies only while the last step's entropy is <= the target.
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2  # nats, over the tokens the loss trains on
    # MoE models: weight of the router's load-balancing loss added to the loss; None: the model config's own
    # router_aux_loss_coef (0 disables it). Refused for a model that is not a mixture of experts.
    router_aux_loss_coef: float | None = None
    off_policy_mask_threshold: float | None = None  # DeepSeek-V3.2's delta: drop stale negative sequences
    num_iterations: int = 1  # optimisation passes over each generation batch (mu in the GRPO paper)
    steps_per_generation: int | None = None  # micro-batches per generation batch; None: gradient_accumulation_steps
    # Asynchronous generation (docs/async.md): a worker generates the next batches while this one trains, never
    # more than this many optimizer steps behind the weights that train on them. 0: synchronous, as TRL.
    max_staleness: int = 0
    # Staleness as a controlled variable (docs/async.md): every batch is generated, synchronously, by the weights of
    # exactly this many optimizer steps earlier (fewer at the first steps), kept in a ring. None: off; 0: the same
    # run as None, through the ring's path.
    forced_staleness: int | None = None
    mask_truncated_completions: bool = False  # DAPO: a cut-off answer neither rewarded nor punished
    sync_ref_model: bool = False  # TR-DPO (arXiv 2404.09656): move the reference model toward the policy
    ref_model_mixup_alpha: float = 0.6  # ref <- alpha * policy + (1 - alpha) * ref
    ref_model_sync_steps: int = 512  # every this many optimizer steps
    # false: a rollout correction applies only where the generation backend is not the trained model itself (vLLM),
    # as TRL's vllm_importance_sampling_correction does; model=hf sets it.
    correct_policy_sampler: bool = True
    # Multi-turn tool use (+environment=NAME or tools=[...], docs/agents.md)
    max_tool_calling_iterations: int | None = None  # rounds of tool calls per completion; None: until the length ends
    tool_timeout: float = 30.0  # seconds a tool call may take; a slower one counts as a failure


@dataclass
class TrainerConfig:
    max_steps: int = 500  # optimizer steps; -1: as many as num_train_epochs passes over the prompts take (TRL)
    num_train_epochs: float = 3.0  # used only with max_steps=-1
    learning_rate: float = 1e-6
    per_device_train_batch_size: int = 8  # completions per micro-batch
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: Any = None  # the schedule's own options: {num_cycles:2} for cosine. `Any`: free keys
    warmup_ratio: float = 0.0
    warmup_steps: float = 0  # > 0 replaces warmup_ratio: a number of steps, or below 1 a share of them (transformers)
    # transformers' optimizer names (docs/training.md): adamw_torch, adamw_torch_fused, adafactor, sgd, adamw_8bit...
    optim: str = "adamw_torch_fused"
    optim_args: str | None = None  # the optimizer's own options, as in transformers: "momentum=0.9,nesterov=true"
    weight_decay: float = 0.0  # not on biases and norm weights, as in transformers
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    # Micro-batches of completions of similar lengths, each padded only to its own longest: less compute for the
    # same gradient (grpo_kit/training/batches.py). None: wherever the loss and settings leave the gradient unchanged.
    group_by_length: bool | None = None
    # Micro-batches cut by a token budget instead of per_device_train_batch_size completions: each at most this many
    # padded tokens (or, with packing, tokens), shortest completions first; the same gradient. None: fixed row counts.
    max_tokens_per_micro_batch: int | None = None
    # Padding-free passes: several sequences per row, each attending only to itself (grpo_kit/model/packing.py).
    packing: bool = False
    # no, bf16 (CPU too) or fp16 (GPU): accelerate's autocast around the forward passes; auto: bf16 on a GPU that
    # has it, else no (the log says which).
    mixed_precision: str = "no"
    tf32: bool | None = None  # TF32 matmuls and convolutions on CUDA GPUs that have them; None: torch's default
    torch_empty_cache_steps: int | None = None  # free the GPU's cached memory every this many steps; None: never
    ddp_timeout: int = 1800  # seconds processes wait for one another in a collective call (TRL's default)
    # torch.utils.checkpoint's options when model.gradient_checkpointing is on (use_reentrant: false unless given),
    # and transformers' every_n_layers and offload. `Any`: its keys are free.
    gradient_checkpointing_kwargs: Any = None
    report_to: list[str] = field(default_factory=list)  # experiment trackers: tensorboard, wandb, trackio
    project: str = "grpo_kit"  # the trackers' project (TRL's default is huggingface)
    run_name: str | None = None  # the trackers' name for this run; None: the run directory's last two parts
    logging_steps: int = 1
    logging_first_step: bool = False  # also log the first step, whatever logging_steps (TRL's logging_first_step)
    progress_bar: bool = True
    save_model: bool = True  # save_pretrained into the run directory at the end
    save_steps: int = 0  # a checkpoint every this many steps (0: only at the end) in RUN_DIR/checkpoints
    save_total_limit: int = 2  # checkpoints kept, newest first
    # Checkpoints of the model's weights only (RUN_DIR/checkpoints/step-N/model/), which cannot be resumed; one
    # written because the run stops early stays whole.
    save_only_model: bool = False
    resume: str | None = None  # auto (the run directory's newest checkpoint, if any) or a checkpoint/run path
    resume_force: bool = False  # resume even though the settings changed since the checkpoint
    max_bad_steps: int = 5  # non-finite losses in a row before the run saves and stops
    reward_timeout: float = 60.0  # seconds a batch's rewards may take; a reward still running gives None
    # Processes for CPU-heavy rewards (math verifiers), started when a batch first needs them; None: one per CPU
    # this process may use, up to 8.
    reward_workers: int | None = None
    # Threads torch computes with on the CPU; None: OMP_NUM_THREADS if set, else the cores this process may use
    # divided by the runs a parallel sweep trains at once (docs/training.md, "Threads and busy machines").
    torch_threads: int | None = None
    sample_every: int = 50  # steps between sample tables (samples.jsonl, samples.html); 0: none
    sample_rows: int = 16  # completions per sample table
    # Completion tables in the trackers (wandb Table, trackio, tensorboard text) and the console, every
    # logging step: prompt, completion, each reward, advantage, step (TRL's log_completions).
    log_completions: bool = False
    num_completions_to_print: int | None = None  # rows of the console's table; None: all of the step's
    log_unique_prompts: bool = False  # one row per prompt in the trackers' tables: its group's first completion
    # The policy's forward compiled with torch.compile for the passes that score completions (TRL's torch_compile):
    # the training pass and the old log-probs; generation and the reference's passes stay plain.
    torch_compile: bool = False
    torch_compile_backend: str | None = None  # torch.compile's backend (needs torch_compile); None: inductor
    torch_compile_mode: str | None = None  # torch.compile's mode, max-autotune say (needs torch_compile); None: its own
    # The best checkpoint: the one whose metric_for_best_model (a logged metric, e.g. eval/reward) is best; it is
    # never deleted by save_total_limit. greater_is_better None: true unless the name ends in "loss" (TRL).
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    load_best_model_at_end: bool = False  # the best checkpoint's weights become the final model/
    # The Hub (docs/hub.md): the model, and checkpoints by hub_strategy, uploaded through huggingface_hub.
    push_to_hub: bool = False
    hub_model_id: str | None = None  # user/name or name; None: the run directory's name
    hub_strategy: str = "every_save"  # end, every_save or checkpoint (TRL's meanings)
    hub_private_repo: bool | None = None  # None: the Hub's default
    # None: huggingface_hub's own login (HF_TOKEN, `hf auth login`); a secret, written to no file and no log
    hub_token: str | None = field(default=None, metadata={SECRET: True})
    hub_revision: str | None = None  # the branch pushed to, created from main if missing; None: main
    # Push each save even while the previous push is still uploading (otherwise that save is not pushed)
    hub_always_push: bool = False


@dataclass
class EvalConfig:
    """Held-out prompts, generated for and scored like training prompts, with their metrics logged under eval/.

    Evaluation is on when an eval set is named: a file or hub dataset (`path`), or a split of the training hub
    dataset (`split`). The embedded task's `test` split holds sums that neither its pretraining nor its training
    sees; its `train` split, sums it is trained on.
    """

    path: str | None = None  # a json/jsonl/parquet/csv file or a hub dataset of eval prompts
    split: str | None = None  # the split of `path`, or of data.path when `path` is not given
    steps: int = 0  # evaluate every this many steps, and always at the end (0: only at the end)
    on_start: bool = False  # also evaluate the policy before its first step, logged as step 0 (TRL's eval_on_start)
    num_examples: int = 128  # prompts evaluated: the first ones of the eval set
    num_generations: int | None = None  # completions per eval prompt (TRL's num_generations_eval); None: as training
    batch_size: int = 32  # prompts per generate call
    # pass@k and maj@k (docs/evaluation.md): num_samples completions per eval prompt, sampled with temperature and
    # top_p (None: the run's generation settings), each counted correct where its reward is >= correct_threshold.
    num_samples: int | None = None  # None: no pass@k / maj@k
    pass_at: list[int] | None = None  # the k of pass@k and maj@k, each <= num_samples; None: [1, num_samples]
    temperature: float | None = None
    top_p: float | None = None
    correct_threshold: float = 1.0
    # The answer a completion votes for in maj@k: the last match of this regular expression (its first group, if it
    # has one); None: the whole completion, stripped. A completion without one does not vote.
    answer_pattern: str | None = None
    # More eval sets by name, each logged under eval/NAME/: eval.sets.NAME.path=FILE (and .split, .num_examples).
    # `Any`: its keys are the sets' free names.
    sets: Any = field(default_factory=dict)


@dataclass
class EvalSetConfig:
    """One named eval set (`eval.sets.NAME`); every other eval setting is the `eval` section's."""

    path: str  # a json/jsonl/parquet/csv file or a hub dataset
    split: str | None = None  # the hub dataset's split ("train" when not given)
    num_examples: int | None = None  # None: eval.num_examples


@dataclass
class RolloutFilesConfig:
    save: bool = False  # keep every scored generation batch in RUN_DIR/rollouts/ (for rollout_files.replay)
    replay: str | None = None  # a run directory whose saved rollouts this run trains on instead of generating


SHADOW_GRADIENT_EVERY = "gradient_every"  # the one key of `shadow` that is not a loss's name


@dataclass
class GradientDiagnosticsConfig:
    """+diagnostics=gradient (docs/instruments.md): the gradient noise scale every step, and every `groups_every`
    steps the gradient of each group of completions. Gradients are kept as count sketches of `sketch_size` numbers
    (seeded by `seed`), never as copies."""

    sketch_size: int = 4096
    seed: int = 0
    groups_every: int = 10  # steps between group splits, each 9 extra backward passes per micro-batch; 0: none
    ema: float = 0.9  # the noise scale's numerator and denominator are smoothed over steps with this decay


@dataclass
class RunConfig:
    seed: int = 42
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout_files: RolloutFilesConfig = field(default_factory=RolloutFilesConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # One node per plugin kind, filled by the group choices (`+loss=dapo`, `advantage=rloo`, ...).
    loss: Any = None
    importance_sampling: Any = None
    rollout_correction: Any = None
    advantage: Any = None
    generation: Any = None
    environment: Any = None  # +environment=NAME: tools from an environment built per completion
    rollout: Any = None  # +rollout=NAME: a custom generation instead of the generation backend's
    sampler: Any = None  # +sampler=NAME: which prompts make each generation batch (uniform: shuffled passes)
    tools: list[str] = field(default_factory=list)  # tool functions by import path: tools=[pkg.mod:fn]
    reward: dict = field(default_factory=dict)  # name -> options, one entry per selected reward
    hook: dict = field(default_factory=dict)  # name -> options, one entry per selected hook plugin
    # Instruments (docs/instruments.md). +shadow=[cispo,grpo]: losses computed beside the trained one, each at
    # shadow.NAME with its options; their gradients compared with the trained one's every gradient_every steps.
    shadow: dict = field(default_factory=lambda: {SHADOW_GRADIENT_EVERY: 10})
    diagnostics: Any = None  # +diagnostics=gradient: GradientDiagnosticsConfig


def named_plugin_config(config: type, name: str) -> type:
    """The plugin's dataclass plus the `name` field that tells the core which plugin the node belongs to."""
    return dataclasses.make_dataclass(config.__name__, [("name", str, field(default=name))], bases=(config,))


# Options renamed since 0.1, old path -> new: a command line that names an old one is told the new name, and a run
# saved under an old one (its checkpoints' config, a sweep's config.yaml) reads as if saved under the new one.
RENAMED_OPTIONS = {
    "rollouts": "rollout_files",  # beside `rollout` (+rollout=NAME, a custom rollout plugin) it read as its plural
    "model.length_groups": "model.passes_by_length",  # beside trainer.group_by_length, which orders micro-batches
}


def under_current_names(config: dict) -> dict:
    """A saved config (nested dicts) with every renamed option moved to its current name."""
    config = copy.deepcopy(config)
    for old, new in RENAMED_OPTIONS.items():
        *old_parents, old_name = old.split(".")
        *new_parents, new_name = new.split(".")
        holder = config
        for parent in old_parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if not isinstance(holder, dict) or old_name not in holder:
            continue
        value = holder.pop(old_name)
        target = config
        for parent in new_parents:
            target = target.setdefault(parent, {})
        target.setdefault(new_name, value)
    return config
