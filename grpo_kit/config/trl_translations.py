"""The TRL fields whose value does not carry over as it is: each function reads the value and the whole recipe (a
field such as `vllm_gpu_memory_utilization` means something only beside `use_vllm` and `vllm_mode`) and returns
grpo_kit overrides, or raises `Refusal` for a value grpo_kit cannot honour. The tables that use them:
grpo_kit/config/trl_fields.py and grpo_kit/config/trl_script_fields.py.
"""

from typing import Any

from grpo_kit.config.trl_entries import Refusal, Translate

TRACKERS = ("tensorboard", "wandb", "trackio")
CLIPPED_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # the losses with epsilon, epsilon_high and delta


def loss_of(recipe: dict) -> str:
    return recipe.get("loss_type", "dapo")  # TRL 1.16's default


def bf16(value, recipe: dict) -> dict:
    if value is None or recipe.get("fp16"):  # None: TRL's bf16-unless-fp16, which model=hf's `auto` carries
        return {}
    return {"trainer.mixed_precision": "bf16" if value else "no"}


def fp16(value, recipe: dict) -> dict:
    return {"trainer.mixed_precision": "fp16"} if value else {}


def top_k(value, recipe: dict) -> dict:
    return {"generation.top_k": None if value in (0, None) else value}  # TRL's 0 keeps every token, as our null


def disable_tqdm(value, recipe: dict) -> dict:
    return {} if value is None else {"trainer.progress_bar": not value}


def report_to(value, recipe: dict) -> dict:
    names = [value] if isinstance(value, str) else list(value or [])
    names = [name for name in names if name != "none"]
    if unknown := [name for name in names if name not in TRACKERS]:
        raise Refusal(f"grpo_kit logs to {', '.join(TRACKERS)} only, not {', '.join(unknown)}", "trainer.report_to")
    return {"trainer.report_to": names}


def whole_steps(key: str) -> Translate:
    """A number of steps; TRL also reads a float below 1 as a share of the run's steps, which grpo_kit does not."""

    def translate(value, recipe: dict) -> dict:
        if isinstance(value, float) and 0 < value < 1:
            raise Refusal(f"{value} is a share of the run's steps in TRL; grpo_kit counts whole steps", key)
        return {key: int(value)}

    return translate


def save_steps(value, recipe: dict) -> dict:
    return {} if recipe.get("save_strategy") == "no" else whole_steps("trainer.save_steps")(value, recipe)


def save_strategy(value, recipe: dict) -> dict:
    if value == "steps":
        return {}  # save_steps says how often
    if value == "no":
        return {"trainer.save_steps": 0}  # grpo_kit still saves the final model (trainer.save_model)
    if value == "best":
        raise Refusal(
            "grpo_kit saves every save_steps steps and keeps the best of them whatever save_total_limit says",
            "trainer.metric_for_best_model",
        )
    raise Refusal(f"grpo_kit checkpoints every N steps, not every {value}", "trainer.save_steps")


def metric_for_best_model(value, recipe: dict) -> dict:
    """transformers names eval metrics eval_NAME, and puts eval_ before a name without it; grpo_kit's are eval/NAME."""
    if value is None:
        return {}
    name = value.removeprefix("eval_")
    if name == "loss":
        raise Refusal("grpo_kit's evaluation generates and scores completions; it computes no loss", "eval/reward")
    return {"trainer.metric_for_best_model": f"eval/{name}"}


def compile_option(key: str) -> Translate:
    """torch_compile_backend and torch_compile_mode: in transformers, setting one turns torch_compile on."""

    def translate(value, recipe: dict) -> dict:
        return {} if value is None else {key: value, "trainer.torch_compile": True}

    return translate


def save_total_limit(value, recipe: dict) -> dict:
    if value is None:
        raise Refusal("TRL keeps every checkpoint; grpo_kit keeps a number of them", "trainer.save_total_limit=N")
    return {"trainer.save_total_limit": value}


def logging_strategy(value, recipe: dict) -> dict:
    if value != "steps":
        raise Refusal(f"grpo_kit logs every N steps, not {value}", "trainer.logging_steps")
    return {}


def eval_strategy(value, recipe: dict) -> dict:
    """TRL's grpo script evaluates on the dataset's `dataset_test_split` whenever eval_strategy is not "no"."""
    if value == "no":
        return {}
    if value != "steps":
        raise Refusal(f"grpo_kit evaluates every N steps, not every {value}", "eval.steps")
    every = recipe.get("eval_steps") or recipe.get("logging_steps", 10)
    return {"eval.split": recipe.get("dataset_test_split", "test"), **whole_steps("eval.steps")(every, recipe)}


def read_with_eval_strategy(value, recipe: dict) -> dict:
    if recipe.get("eval_strategy", "no") == "no" and value is not None:
        raise Refusal("TRL evaluates nothing unless eval_strategy is set", "eval_strategy: steps, or remove it")
    return {}  # eval_strategy's translation reads it


def resume_from_checkpoint(value, recipe: dict) -> dict:
    if value in (None, False):
        return {}
    return {"trainer.resume": "auto" if value is True else value}


def train_sampling_strategy(value, recipe: dict) -> dict:
    if value == "random":
        return {}
    if value == "sequential":
        return {"data.shuffle": False}
    raise Refusal(f"no {value} sampler", "+sampler=NAME (grpo-kit plugins --kind sampler)")


def checkpointing(value, recipe: dict) -> dict:
    return {} if value is None else {"model.gradient_checkpointing": value}


def checkpointing_kwargs(value, recipe: dict) -> dict:
    return {} if value is None else {"trainer.gradient_checkpointing_kwargs": dict(value)}


def pad_to_multiple_of(value, recipe: dict) -> dict:
    # TRL's auto pads only on Neuron; grpo_kit's auto (64 on a CUDA GPU) changes shapes, never a value.
    return {} if value == "auto" else {"model.pad_to_multiple_of": value}


def loss_type(value, recipe: dict) -> dict:
    return {"loss": value}


def loss_option(option: str, losses: tuple[str, ...], default: Any) -> Translate:
    """A loss's own option, where the recipe's loss_type reads it; at TRL's default it asks for nothing."""

    def translate(value, recipe: dict) -> dict:
        if loss_of(recipe) in losses:
            return {f"loss.{option}": value}
        if value == default:
            return {}
        raise Refusal(f"loss_type={loss_of(recipe)} does not read it (in TRL either)", f"loss.{option} of {losses}")

    return translate


def scale_rewards(value, recipe: dict) -> dict:
    name = {True: "group", False: "none"}.get(value, value)
    if recipe.get("multi_objective_aggregation") == "normalize_then_sum":
        if name != "group":
            raise Refusal("normalize_then_sum scales each reward within its group", "advantage=gdpo")
        return {}  # multi_objective_aggregation chooses the advantage
    return {"advantage": name}


def multi_objective_aggregation(value, recipe: dict) -> dict:
    if value == "sum_then_normalize":
        return {}  # the advantage scale_rewards chooses
    if value == "normalize_then_sum":
        return {"advantage": "gdpo"}  # each reward normalised in its group, then the weighted sum (GDPO)
    raise Refusal(f"unknown aggregation {value}", "advantage=NAME")


def correction_choice(value, recipe: dict) -> dict:
    return {} if value else {"rollout_correction": "none"}  # on: model=hf's sequence_mask, or the mode's


def correction_option(key: str) -> Translate:
    def translate(value, recipe: dict) -> dict:
        if not recipe.get("vllm_importance_sampling_correction", True):
            return {}  # no correction: TRL ignores its mode and bounds too
        return {key: value} if value is not None or key != "rollout_correction" else {}

    return translate


def capped(value, recipe: dict) -> dict:
    return {} if value is None else correction_option("rollout_correction.max")(value, recipe)
