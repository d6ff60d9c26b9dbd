"""`grpo-kit eval RUN_DIR_OR_MODEL [OVERRIDES]`: evaluate a trained model on eval sets, without training.

The model is evaluated as the run evaluates it at a step (grpo_kit/rollout/evaluation.py): the same generation
backend, rewards and sampling, seeded by the run's seed and the model's step, so that a run's final model scores
what the run's last evaluation logged, unless the overrides change the settings. The metrics go to eval.json (the
run's or the checkpoint's folder, or --output) and a table.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

from grpo_kit.contract.errors import ConfigError, UserError

EVAL_FILE = "eval.json"
GONE = (
    "a run still training deletes its older checkpoints (trainer.save_total_limit). Evaluate one it keeps, or the "
    "run once it has finished, or give --output FILE elsewhere."
)
DESCRIPTION = (
    "Evaluate a run's final model (RUN_DIR/model), one of its checkpoints (RUN_DIR/checkpoints/step-N) or a model "
    "folder on the run's eval sets, or on others given as overrides (eval.path=FILE, eval.sets.NAME.path=FILE, "
    "eval.num_samples=8 for pass@k and maj@k; docs/evaluation.md). Writes eval.json and prints a table."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, metavar="RUN_DIR_OR_MODEL", help="a run directory, checkpoint or model")
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="settings, as for python -m grpo_kit")
    parser.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help=f"where to write the metrics (default: {EVAL_FILE} "
        "in the run directory, or in the checkpoint or model folder)",
    )


def eval_command(args: argparse.Namespace) -> int:
    # Loaded when the command runs: the other commands answer without torch.
    from grpo_kit.cli.eval_targets import eval_config, find_target
    from grpo_kit.plugins.registry import Registry

    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")
    try:
        if args.output is not None and not args.output.parent.is_dir():  # before the evaluation, not after it
            raise ConfigError(f"--output {args.output}: the folder {args.output.parent} does not exist. Create it.")
        target = find_target(args.path)
        registry = Registry()
        cfg = eval_config(target, args.overrides, registry)
        metrics = evaluate(cfg, target, registry)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except FileNotFoundError as error:  # a checkpoint that a running run's save_total_limit rotated away meanwhile
        print(f"error: {error.filename} went away during the evaluation: {GONE}", file=sys.stderr)
        return 1
    print(metrics_table(metrics))
    output = args.output or target.output / EVAL_FILE
    result = {"model": str(target.path), "step": target.step, "overrides": args.overrides, "metrics": metrics}
    try:
        output.write_text(json.dumps(result, indent=1) + "\n")
    except FileNotFoundError:
        print(
            f"error: {output.parent} went away during the evaluation, so {output} could not be written (the "
            f"metrics are above): {GONE}",
            file=sys.stderr,
        )
        return 1
    print(f"Wrote {output}")
    return 0


def evaluate(cfg, target, registry) -> dict[str, float]:
    """The eval/ metrics of `target` (an eval_targets.Target) under `cfg`, in this process."""
    from accelerate import Accelerator
    from omegaconf import OmegaConf

    from grpo_kit.config.compose import options
    from grpo_kit.contract.eos import eos_token_ids
    from grpo_kit.model.loading import load_model
    from grpo_kit.model.precision import resolve_mixed_precision
    from grpo_kit.model.threads import use_torch_threads
    from grpo_kit.outputs.checkpoints import load_checkpoint
    from grpo_kit.rollout.checks import check_prompt_lengths, check_reward_columns
    from grpo_kit.rollout.evaluation import Evaluator, load_eval_sets
    from grpo_kit.rollout.prompts import use_chat_template_kwargs
    from grpo_kit.rollout.rollout import Rollout
    from grpo_kit.rollout.scoring import Scorer
    from grpo_kit.training.builders import build_custom_rollout, build_rewards, build_tool_use
    from grpo_kit.training.vision import image_prompts

    eval_sets = load_eval_sets(cfg.eval, cfg.data)
    if not eval_sets:
        raise ConfigError(
            "No eval set to evaluate on: the run named none. Name one with eval.path=FILE (or eval.split=test of "
            "the training hub dataset), or several with eval.sets.NAME.path=FILE."
        )
    rewards, reward_weights = build_rewards(cfg, registry)
    for dataset in eval_sets.values() if cfg.rollout is None else ():
        check_reward_columns(rewards, dataset, OmegaConf.to_container(cfg.reward, resolve=True))
    generation = registry.build("generation", cfg.generation.name, options(cfg.generation))
    images = image_prompts(cfg, list(eval_sets.values()), generation)
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision(cfg.trainer.mixed_precision))
    model, tokenizer = load_model(cfg.model)
    if target.state is not None:
        weights = load_checkpoint(target.state.parent)["model"]
        if weights is None:
            raise ConfigError(
                f"{target.path} was written in parts by FSDP or DeepSpeed, which only a run can read back: evaluate "
                "the run's final model, or a checkpoint saved with trainer.save_only_model=true."
            )
        model.load_state_dict(weights)
    use_torch_threads(cfg.trainer.torch_threads, model.config)
    use_chat_template_kwargs(tokenizer, OmegaConf.to_container(cfg.data, resolve=True)["chat_template_kwargs"])
    max_positions = getattr(model.config, "max_position_embeddings", None)
    for dataset in eval_sets.values():
        check_prompt_lengths(dataset, tokenizer, cfg.generation.max_completion_length, max_positions)
    eos = eos_token_ids(model, tokenizer)
    model = accelerator.prepare(model)
    model.eval()
    with Scorer(rewards, timeout=cfg.trainer.reward_timeout, workers=cfg.trainer.reward_workers) as scorer:
        generation.start(model, tokenizer, accelerator)
        try:
            rollout = Rollout(
                sampler=None,  # evaluation hands the rows itself
                generation=generation,
                scorer=scorer,
                reward_weights=reward_weights,
                advantage=None,  # nor are advantages computed
                tokenizer=tokenizer,
                num_generations=cfg.generation.num_generations,
                mask_truncated_completions=cfg.algorithm.mask_truncated_completions,
                hooks=None,
                accelerator=accelerator,
                eos_token_ids=eos,
                tool_use=build_tool_use(cfg, registry, tokenizer, generation, accelerator, eos),
                custom=build_custom_rollout(cfg, registry),
                images=images,
            )
            return Evaluator(eval_sets, rollout, cfg.eval, cfg.seed, target.step, accelerator)(target.step)
        finally:
            generation.close()


def metrics_table(metrics: dict[str, float]) -> str:
    """One row per eval set (the held-out one, then each named one), one column per summary metric: reward, length,
    pass@k, maj@k. The per-reward metrics are in eval.json."""
    named = {name.split("/")[1] for name in metrics if name.count("/") == 2 and name.endswith("/reward")}
    rows: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        eval_set, _, metric = name.removeprefix("eval/").partition("/")
        if eval_set not in named:
            eval_set, metric = "(held-out)", name.removeprefix("eval/")
        if "/" not in metric and metric != "reward_std":
            rows.setdefault(eval_set, {})[metric] = value
    columns = list(dict.fromkeys(column for row in rows.values() for column in row))
    lines = [["set", *columns]] + [
        [name, *(_number(row.get(column)) for column in columns)] for name, row in rows.items()
    ]
    widths = [max(len(line[index]) for line in lines) for index in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


def _number(value) -> str:
    return "–" if value is None or value != value else f"{value:.3f}"
