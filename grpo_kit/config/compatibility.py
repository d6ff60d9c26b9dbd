"""Settings that do not go together, found when a run is composed: an error where TRL or the papers reject the
combination, a warning where they discourage it. Each message says what to change.

The rules are declared by the plugins (a loss's importance-sampling level, the correction levels it accepts,
an advantage that needs groups), so this file names no plugin. It reads them as the plugins registered them
(`Plugin.traits`), so that checking a run imports no plugin's implementation.
"""

import dataclasses
import logging
import math
import re

from omegaconf import DictConfig

from grpo_kit.config.instruments import check_instruments
from grpo_kit.config.schema import DEFAULT_CHOICES, EvalSetConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.plugins.registry import Registry

log = logging.getLogger(__name__)


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch to compose
MIXED_PRECISIONS = ("no", "bf16", "fp16", "auto")
GRADIENT_CHECKPOINTING = (True, False, "auto")
HUB_STRATEGIES = ("end", "every_save", "checkpoint")  # transformers' HubStrategy values, less all_checkpoints


def check_compatibility(cfg: DictConfig, registry: Registry) -> None:
    check_reward_weights(cfg.reward)
    check_generation(cfg.generation)
    check_training_length(cfg.trainer)
    check_housekeeping(cfg.trainer)
    check_hub(cfg.trainer)
    loss = registry.get("loss", cfg.loss.name).traits
    level = registry.get("importance_sampling", cfg.importance_sampling.name).traits["level"]
    correction_level = registry.get("rollout_correction", cfg.rollout_correction.name).traits["level"]
    advantage = registry.get("advantage", cfg.advantage.name).traits

    wanted = loss["importance_sampling_level"]
    if wanted is not None and wanted != level:
        # Only this warning's reason is read from the loss's class, which imports it.
        advice = registry.get("loss", cfg.loss.name).implementation.importance_sampling_advice
        log.warning(
            "loss %s %s: importance_sampling=%s is discouraged, use importance_sampling=%s.",
            cfg.loss.name,
            advice,
            cfg.importance_sampling.name,
            wanted,
        )
    accepted = loss["rollout_correction_levels"]
    corrected = correction_level is not None and corrects_rollouts(cfg, registry)
    if correction_level is not None and not corrected:
        log.info(
            "rollout_correction=%s is off: generation=%s samples with the trained model itself, and "
            "algorithm.correct_policy_sampler=false corrects other samplers only (vLLM's, as TRL does).",
            cfg.rollout_correction.name,
            cfg.generation.name,
        )
    if corrected and accepted is not None and correction_level not in accepted:
        raise ConfigError(
            f"loss {cfg.loss.name} takes only {'/'.join(accepted)}-level rollout corrections, but "
            f"rollout_correction={cfg.rollout_correction.name} is {correction_level}-level: choose one of "
            f"{', '.join(_corrections_of_level(registry, accepted))} or none."
        )
    if advantage["needs_groups"] and cfg.generation.num_generations < 2:
        raise ConfigError(
            f"advantage={cfg.advantage.name} compares the completions of one prompt, so it needs "
            f"generation.num_generations >= 2 (got {cfg.generation.num_generations})."
        )
    check_algorithm(cfg)
    if cfg.trainer.mixed_precision not in MIXED_PRECISIONS:
        raise ConfigError(
            f"trainer.mixed_precision={cfg.trainer.mixed_precision} is not one of {', '.join(MIXED_PRECISIONS)}."
        )
    if cfg.model.gradient_checkpointing not in GRADIENT_CHECKPOINTING:
        raise ConfigError(
            f"model.gradient_checkpointing={cfg.model.gradient_checkpointing} must be true, false or auto (on where "
            "the model supports it)."
        )
    if cfg.eval.num_generations is not None and cfg.eval.num_generations < 1:
        raise ConfigError(f"eval.num_generations={cfg.eval.num_generations} must be at least 1 (or null: as training).")
    check_eval(cfg.eval)
    check_best_checkpoint(cfg.trainer, cfg.eval)
    check_instruments(cfg, registry, corrected)
    check_sampler(cfg, registry)
    check_structured_outputs(cfg, registry)


def check_algorithm(cfg: DictConfig) -> None:
    """The algorithm's own settings, each within its range and with what it needs."""
    algo = cfg.algorithm
    if algo.sync_ref_model and algo.beta == 0.0:
        raise ConfigError(
            "algorithm.sync_ref_model=true moves a reference model that is used only when algorithm.beta > 0: "
            "set algorithm.beta, or algorithm.sync_ref_model=false."
        )
    if not 0.0 <= algo.top_entropy_quantile <= 1.0:
        raise ConfigError(
            f"algorithm.top_entropy_quantile={algo.top_entropy_quantile} must lie in [0, 1] (0.2 in its paper)."
        )
    if algo.use_adaptive_entropy and algo.entropy_coef_min > algo.entropy_coef_max:
        raise ConfigError(
            f"algorithm.entropy_coef_min={algo.entropy_coef_min} is above algorithm.entropy_coef_max="
            f"{algo.entropy_coef_max}: adaptive entropy control keeps the coefficient between them."
        )
    if algo.off_policy_mask_threshold is not None and algo.off_policy_mask_threshold <= 0:
        raise ConfigError(
            f"algorithm.off_policy_mask_threshold={algo.off_policy_mask_threshold} is a KL bound and must be "
            "positive (0.5, say), or null to turn the mask off."
        )
    if algo.num_iterations < 1:
        raise ConfigError(f"algorithm.num_iterations={algo.num_iterations} must be at least 1.")
    if algo.sync_ref_model and cfg.model.lora.enabled:
        raise ConfigError(
            "algorithm.sync_ref_model=true cannot move the reference of a LoRA run, which is the frozen base model "
            "itself: set algorithm.sync_ref_model=false, or train without LoRA."
        )


def check_housekeeping(trainer: DictConfig) -> None:
    if trainer.ddp_timeout < 1:
        raise ConfigError(
            f"trainer.ddp_timeout={trainer.ddp_timeout} is in seconds and must be at least 1 (TRL: 1800)."
        )
    if trainer.torch_empty_cache_steps is not None and trainer.torch_empty_cache_steps < 1:
        raise ConfigError(
            f"trainer.torch_empty_cache_steps={trainer.torch_empty_cache_steps} must be at least 1 (or null: never)."
        )
    check_torch_compile(trainer)


def check_torch_compile(trainer: DictConfig) -> None:
    """trainer.torch_compile_backend and torch_compile_mode need trainer.torch_compile (which TRL turns on by either),
    and packed passes waste what compiling costs."""
    for name in ("torch_compile_backend", "torch_compile_mode"):
        if trainer[name] is not None and not trainer.torch_compile:
            raise ConfigError(
                f"trainer.{name}={trainer[name]} is an option of trainer.torch_compile, which is off: add "
                "trainer.torch_compile=true (TRL turns it on by either option), or drop the option."
            )
    if trainer.torch_compile and trainer.packing:
        log.warning(
            "trainer.torch_compile=true with trainer.packing=true: each packed pass makes torch.compile compile "
            "anew until its recompile limit (8), past which those passes run uncompiled. The values are right, "
            "but the compiling costs more than it saves: drop one of the two."
        )


def check_hub(trainer: DictConfig) -> None:
    """trainer.hub_strategy takes transformers' values but all_checkpoints, and a push ends with the final model."""
    if trainer.hub_strategy not in HUB_STRATEGIES:
        refused = (
            " all_checkpoints is refused: each checkpoint holds the whole training state (the optimizer's too), "
            "several times the model's size, and the repo's history already keeps every pushed model."
            if trainer.hub_strategy == "all_checkpoints"
            else ""
        )
        raise ConfigError(
            f"trainer.hub_strategy={trainer.hub_strategy!r}: the accepted values are end (the final model only), "
            "every_save (the model at each checkpoint and at the end) and checkpoint (every_save, and the latest "
            f"checkpoint in last-checkpoint/ to resume from).{refused}"
        )
    if trainer.push_to_hub and not trainer.save_model:
        raise ConfigError(
            "trainer.push_to_hub=true ends by pushing the final model, which trainer.save_model=false does not "
            "save: set trainer.save_model=true, or trainer.push_to_hub=false."
        )


def check_sampler(cfg: DictConfig, registry: Registry) -> None:
    """A sampler that reads rewards cannot draw ahead of them; a replayed run draws nothing."""
    sampler = cfg.sampler.name
    if cfg.algorithm.max_staleness and registry.get("sampler", sampler).traits["uses_rewards"]:
        raise ConfigError(
            f"sampler={sampler} draws by the rewards it has seen, but algorithm.max_staleness="
            f"{cfg.algorithm.max_staleness} draws prompts ahead of them, and a resumed run could not draw as the first "
            "one did: use algorithm.max_staleness=0 (algorithm.forced_staleness gives a known lag), or a sampler "
            "that reads no rewards (uniform, curriculum)."
        )
    if cfg.rollout_files.replay and sampler != DEFAULT_CHOICES["sampler"]:
        raise ConfigError(
            f"rollout_files.replay trains on saved batches, so sampler={sampler} would draw nothing: leave the "
            "sampler out of a replayed run."
        )


def check_structured_outputs(cfg: DictConfig, registry: Registry) -> None:
    """generation.structured_outputs_regex constrains what the backend samples: a backend that cannot would train on
    completions the regex forbids, and a custom rollout samples without the backend's settings."""
    regex = cfg.generation.structured_outputs_regex
    if regex is None:
        return
    if cfg.rollout is not None:
        raise ConfigError(
            f"generation.structured_outputs_regex={regex!r} constrains the generation backend's sampling, but "
            f"+rollout={cfg.rollout.name} generates the completions itself: constrain them in the rollout, or drop "
            "generation.structured_outputs_regex."
        )
    if not registry.get("generation", cfg.generation.name).traits["structured_outputs"]:
        able = [plugin.name for plugin in registry.plugins("generation") if plugin.traits["structured_outputs"]]
        raise ConfigError(
            f"generation.structured_outputs_regex={regex!r}: generation={cfg.generation.name} cannot keep its samples "
            "within a regular expression (it does not declare structured_outputs), so it would train on completions "
            f"the regex forbids. Use {' or '.join(f'generation={name}' for name in able) or 'a backend that can'} "
            "(vLLM's structured outputs), or drop generation.structured_outputs_regex."
        )


def check_reward_weights(rewards: DictConfig) -> None:
    """The weighted sum of the rewards is taken in float32: any other weight would make it infinite or NaN."""
    for key, node in rewards.items():
        if not (math.isfinite(node.weight) and abs(node.weight) <= FLOAT32_MAX):
            raise ConfigError(
                f"reward.{key}.weight={node.weight}: a reward's weight must be a finite number within float32's range "
                "(|w| <= 3.4e38), e.g. 1 or 0.5: the rewards are summed in float32."
            )


def check_generation(generation: DictConfig) -> None:
    """The sampling settings the core itself reads, whatever the backend (which checks the rest itself)."""
    if generation.temperature <= 0:
        raise ConfigError(
            f"generation.temperature={generation.temperature} must be positive: the trainer divides the logits by "
            "it to recompute the sampler's log-probs, so greedy decoding (0) cannot be trained on. Use 1.0 to "
            "sample from the model as it is, or a smaller positive value (0.7, say) for sharper samples."
        )
    if generation.num_generations < 1:
        raise ConfigError(
            f"generation.num_generations={generation.num_generations} must be at least 1: it is the number of "
            "completions per prompt (8 is TRL's default; group advantages need 2 or more)."
        )
    if generation.max_completion_length < 1:
        raise ConfigError(
            f"generation.max_completion_length={generation.max_completion_length} must be at least 1: it is the "
            "number of tokens a completion may have (512 is TRL's default)."
        )


def check_training_length(trainer: DictConfig) -> None:
    """max_steps counts optimizer steps; -1 (TRL's convention) trains num_train_epochs passes over the prompts."""
    if trainer.max_steps == -1:
        if trainer.num_train_epochs <= 0:
            raise ConfigError(
                f"trainer.max_steps=-1 trains trainer.num_train_epochs passes over the prompts, but "
                f"trainer.num_train_epochs={trainer.num_train_epochs}: give a positive number of epochs (3, say), "
                "or a number of optimizer steps with trainer.max_steps=N."
            )
    elif trainer.max_steps < 1:
        raise ConfigError(
            f"trainer.max_steps={trainer.max_steps} would train nothing: give the number of optimizer steps "
            "(trainer.max_steps=500, say), or trainer.max_steps=-1 to train trainer.num_train_epochs passes over "
            "the prompts."
        )


def corrects_rollouts(cfg: DictConfig, registry: Registry) -> bool:
    """Whether the chosen rollout correction applies to this run's samples. The transformers backend samples with
    the trained model itself, so its log-probs differ from the trainer's by rounding only: TRL corrects under vLLM
    alone (a rollout_func's samples too), and algorithm.correct_policy_sampler=false (model=hf) does the same. Under
    algorithm.forced_staleness >= 1 the sampler is an older policy by construction, whatever the backend."""
    if cfg.algorithm.correct_policy_sampler or (cfg.algorithm.forced_staleness or 0) >= 1:
        return True
    return not registry.get("generation", cfg.generation.name).traits["samples_from_policy"]


def _corrections_of_level(registry: Registry, levels) -> list[str]:
    return [plugin.name for plugin in registry.plugins("rollout_correction") if plugin.traits["level"] in levels]


# Metric names of their own under eval/: a set with one of these names would be read as them.
RESERVED_EVAL_SET_NAMES = ("rewards", "completions")


def check_best_checkpoint(trainer: DictConfig, evaluation: DictConfig) -> None:
    """trainer.metric_for_best_model judges each saved checkpoint by the metric logged at its step, so every save
    step must log it; load_best_model_at_end needs a metric and a final model to put the best weights into."""
    metric = trainer.metric_for_best_model
    if metric is None:
        for name in ("load_best_model_at_end", "greater_is_better"):
            if trainer[name] not in (None, False):
                raise ConfigError(
                    f"trainer.{name} needs trainer.metric_for_best_model, the logged metric that chooses the best "
                    "checkpoint (eval/reward, say). TRL falls back on the loss, which in GRPO says nothing of how "
                    "good the policy is."
                )
        return
    if trainer.load_best_model_at_end and (trainer.save_only_model or not trainer.save_model):
        raise ConfigError(
            "trainer.load_best_model_at_end makes the best checkpoint's weights the final model/, which needs "
            "trainer.save_model=true and whole checkpoints (trainer.save_only_model=false)."
        )
    save_steps = trainer.save_steps
    if metric.startswith("eval/"):
        if evaluation.path is None and evaluation.split is None and not evaluation.sets:
            raise ConfigError(
                f"trainer.metric_for_best_model={metric} is an eval metric, but no eval set is named: set eval.split "
                "or eval.path (docs/evaluation.md), or name a training metric (reward, say)."
            )
        if save_steps and (evaluation.steps == 0 or save_steps % evaluation.steps):
            raise ConfigError(
                f"trainer.metric_for_best_model={metric} judges each checkpoint by the evaluation at its step, but "
                f"trainer.save_steps={save_steps} saves where eval.steps={evaluation.steps} does not evaluate: make "
                "save_steps a multiple of eval.steps."
            )
    elif save_steps and save_steps % trainer.logging_steps:
        raise ConfigError(
            f"trainer.metric_for_best_model={metric} judges each checkpoint by the metric logged at its step, but "
            f"trainer.save_steps={save_steps} saves where trainer.logging_steps={trainer.logging_steps} does not log: "
            "make save_steps a multiple of logging_steps."
        )


def check_eval(evaluation: DictConfig) -> None:
    """pass@k's settings (docs/evaluation.md) and the named eval sets."""
    samples = evaluation.num_samples
    if samples is None:
        for name in ("pass_at", "answer_pattern"):
            if evaluation[name] is not None:
                raise ConfigError(
                    f"eval.{name} is an option of pass@k and maj@k, which eval.num_samples=N turns on: add it "
                    f"(the completions sampled per eval prompt), or drop eval.{name}."
                )
    else:
        if samples < 1:
            raise ConfigError(f"eval.num_samples={samples} must be at least 1: it is the completions per eval prompt.")
        if evaluation.num_generations is not None and evaluation.num_generations != samples:
            raise ConfigError(
                f"eval.num_samples={samples} sets the completions per eval prompt, and eval.num_generations="
                f"{evaluation.num_generations} sets them too: drop eval.num_generations."
            )
        too_large = [k for k in evaluation.pass_at or () if not 1 <= k <= samples]
        if too_large:
            raise ConfigError(
                f"eval.pass_at={list(evaluation.pass_at)}: pass@k and maj@k need 1 <= k <= eval.num_samples={samples} "
                f"(k={too_large[0]} is not): k completions are drawn from the num_samples sampled per prompt. Raise "
                "eval.num_samples or lower k."
            )
    if not math.isfinite(evaluation.correct_threshold):
        raise ConfigError(
            f"eval.correct_threshold={evaluation.correct_threshold} must be a finite number: a completion counts as "
            "correct where its reward is at least this (1 by default)."
        )
    if evaluation.temperature is not None and evaluation.temperature <= 0:
        raise ConfigError(
            f"eval.temperature={evaluation.temperature} must be positive: evaluation samples, as pass@k needs (a "
            "small temperature, 0.1 say, comes close to greedy decoding); null samples as training does."
        )
    if evaluation.top_p is not None and not 0 < evaluation.top_p <= 1:
        raise ConfigError(f"eval.top_p={evaluation.top_p} must lie in (0, 1]; null samples as training does.")
    if evaluation.answer_pattern is not None:
        try:
            re.compile(evaluation.answer_pattern)
        except re.error as error:
            raise ConfigError(f"eval.answer_pattern={evaluation.answer_pattern!r} is no regular expression: {error}.")
    for name, options in evaluation.sets.items():
        check_eval_set(str(name), options)


def check_eval_set(name: str, options) -> None:
    fields = [field.name for field in dataclasses.fields(EvalSetConfig)]
    if name in RESERVED_EVAL_SET_NAMES:
        raise ConfigError(
            f"eval.sets.{name}: {name!r} is a name of eval/ metrics of their own (eval/{name}/...): name the set "
            "otherwise."
        )
    if not isinstance(options, DictConfig) or "path" not in options:
        raise ConfigError(f"eval.sets.{name} names no file: give one with eval.sets.{name}.path=FILE.")
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(
            f"eval.sets.{name}.{unknown[0]} is not an option of an eval set, so nothing would read it. The options "
            f"of eval.sets.{name}: {', '.join(fields)}; the others (eval.num_samples, ...) are the eval section's."
        )
