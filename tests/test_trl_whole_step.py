"""Whole optimizer steps on both sides: grpo_kit's `train` and TRL 1.16.0's `GRPOTrainer.train`, from the same tiny
model, on the same prompts and completions, with the same reward, for three steps.

The completions are fixed, not sampled: TRL gets them through its `rollout_func`, grpo_kit through a rollout plugin
(`+rollout=fixed`), both from `fixed_completions`, so that each side trains on exactly the same tokens. Everything
else each side computes itself: rewards, advantages, old and reference log-probs, losses, gradients, clipping and
AdamW. The final weights must agree within 1e-5, and every step's rewards, advantages, loss and gradient norm too:
clipping and Adam's normalisation hide a gradient of the wrong scale from the weights (with grpo_kit's loss doubled,
dapo's weights after three steps still agree with TRL's within 2e-7; its gradient norms are twice TRL's).

AdamW's epsilon is 1e-5 on both sides: at 1e-8, Adam turns the float rounding of a near-zero gradient into a
whole step, and TRL differs from itself by 1.5e-5 when only the order of the rows changes.

The tests take the `trl` fixture (conftest.py): without trl==1.16.0 they skip, or fail under GRPO_KIT_REQUIRE_TRL=1.
"""

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.kinds import RolloutResult
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import build_tiny_model

PROMPTS = ["1+2=", "3+4=", "5+6=", "7+8=", "9+1=", "2+3=", "4+5=", "6+7="]  # enough for 3 batches, no repeat
NUM_GENERATIONS = 4
PER_DEVICE_TRAIN_BATCH_SIZE = 4
GRADIENT_ACCUMULATION_STEPS = 2  # so that a wrong division by the accumulation steps shows
MAX_COMPLETION_LENGTH = 8
STEPS = 3
LEARNING_RATE = 1e-2  # high, so that three steps move the policy and the clipped ratios take part
MAX_GRAD_NORM = 0.6  # the steps' gradient norms are 0.5 to 0.85: some are clipped, some not
ADAM_EPSILON = 1e-5
SEED = 42
# The metrics of a whole step, which do not depend on how its completions are split into micro-batches (TRL shuffles
# the generation batch before splitting it; grpo_kit groups completions by length): the KL, the entropy and the
# clip ratios, means over micro-batches, differ with the split, so they are left to tests/test_trl_equivalence.py.
STEP_METRICS = ["loss", "grad_norm", "learning_rate"]
# The generation batch's metrics: TRL logs them at the steps that generate, grpo_kit at every step trained on it.
GENERATION_METRICS = [
    "reward",
    "reward_std",
    "rewards/digit_sum/mean",
    "rewards/digit_sum/std",
    "frac_reward_zero_std",
    "completions/mean_length",
]


def fixed_completions(prompts: list[str], tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt ids, and a completion for each prompt that depends only on the prompt and its place in its group:
    digits of random lengths, most ending with EOS, some cut off at the length limit."""
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    prompt_ids = tokenizer(prompts, add_special_tokens=False).input_ids
    completion_ids = []
    for index, prompt in enumerate(prompts):
        draw = random.Random(f"{prompt}/{index % NUM_GENERATIONS}")
        ends = draw.random() < 0.7
        length = draw.randint(1, MAX_COMPLETION_LENGTH) if ends else MAX_COMPLETION_LENGTH
        ids = [draw.choice(digits) for _ in range(length)]
        if ends:
            ids[-1] = tokenizer.eos_token_id
        completion_ids.append(ids)
    return prompt_ids, completion_ids


def digit_sum(prompts, completions, **_) -> list[float]:
    """A deterministic reward that differs within groups: the completion's digit sum modulo 5, scaled to [0, 1]."""
    return [sum(int(character) for character in text if character.isdigit()) % 5 / 4 for text in completions]


# ------------------------------------------------------------------------------------ grpo_kit's side ---
# This module is the grpo_kit run's local plugin module: the fixed rollout, the reward, and a hook that records
# each generation batch's advantages.

RECORDED: dict[str, list] = {"advantages": []}


class FixedRollout:
    def __init__(self, config=None):
        pass

    def __call__(self, rows, tokenizer, generation):
        prompt_ids, completion_ids = fixed_completions([row["prompt"] for row in rows], tokenizer)
        return RolloutResult(prompt_ids, completion_ids)


@grpo_kit.hookimpl
def register_rollouts(register):
    register("fixed", FixedRollout)


@grpo_kit.hookimpl
def register_rewards(register):
    register("digit_sum", digit_sum)


@grpo_kit.hookimpl
def on_advantages(advantages):
    RECORDED["advantages"].append(advantages.tolist())  # None: the advantages stay as they are


def train_grpo_kit(
    model_dir, prompts_file, run_dir, loss: str, beta: float, num_iterations: int, *overrides: str
) -> dict:
    registry = Registry(plugin_manager(autoload=True, local_modules=[__name__], disabled=[]))
    cfg = grpo_kit.compose(
        [
            f"model.name_or_path={model_dir}",
            f"data.path={prompts_file}",
            "data.shuffle=false",
            "+rollout=fixed",
            "+reward=digit_sum",
            f"+loss={loss}",
            f"algorithm.beta={beta}",
            f"algorithm.num_iterations={num_iterations}",
            f"generation.num_generations={NUM_GENERATIONS}",
            f"generation.max_completion_length={MAX_COMPLETION_LENGTH}",
            f"trainer.per_device_train_batch_size={PER_DEVICE_TRAIN_BATCH_SIZE}",
            f"trainer.gradient_accumulation_steps={GRADIENT_ACCUMULATION_STEPS}",
            f"trainer.max_steps={STEPS}",
            f"trainer.learning_rate={LEARNING_RATE}",
            f"trainer.adam_epsilon={ADAM_EPSILON}",
            f"trainer.max_grad_norm={MAX_GRAD_NORM}",
            # model=hf carries TRL's defaults, some of which TRL's side turns off below: float32, no checkpointing, and
            # no rollout correction (TRL's applies to vLLM's samples only).
            "rollout_correction=none",
            "trainer.mixed_precision=no",
            "model.gradient_checkpointing=false",
            "trainer.logging_steps=1",
            "trainer.progress_bar=false",
            "trainer.sample_every=0",
            f"seed={SEED}",
            *overrides,
        ],
        registry,
    )
    RECORDED["advantages"].clear()
    grpo_kit.train(cfg, run_dir, registry)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "metrics": [line for line in lines if "loss" in line],
        "advantages": list(RECORDED["advantages"]),
        "weights": AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32).state_dict(),
        "config": cfg,
    }


# ----------------------------------------------------------------------------------------- TRL's side ---


def train_trl(trl, model_dir, prompts, output_dir, cfg) -> dict:
    import datasets

    class RecordingTrainer(trl.GRPOTrainer):
        """TRL's trainer, recording each generation batch's advantages."""

        advantages: list[list[float]] = []

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.advantages.append(output["advantages"].tolist())
            return output

    def rollout_func(prompts, trainer):
        prompt_ids, completion_ids = fixed_completions(prompts, trainer.processing_class)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    loss = cfg.loss
    epsilon = loss.get("epsilon", 0.2)
    args = trl.GRPOConfig(
        output_dir=str(output_dir),
        loss_type=loss.name,
        epsilon=epsilon,
        epsilon_high=loss.get("epsilon_high") if loss.get("epsilon_high") is not None else epsilon,
        beta=cfg.algorithm.beta,
        num_iterations=cfg.algorithm.num_iterations,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH,
        per_device_train_batch_size=PER_DEVICE_TRAIN_BATCH_SIZE,
        gradient_accumulation_steps=GRADIENT_ACCUMULATION_STEPS,
        max_steps=STEPS,
        learning_rate=LEARNING_RATE,
        optim=cfg.trainer.optim,
        adam_epsilon=ADAM_EPSILON,
        lr_scheduler_type=cfg.trainer.lr_scheduler_type,
        warmup_steps=cfg.trainer.warmup_steps or cfg.trainer.warmup_ratio,  # transformers 5 has warmup_steps only
        weight_decay=cfg.trainer.weight_decay,
        max_grad_norm=cfg.trainer.max_grad_norm,
        temperature=1.0,
        seed=SEED,
        shuffle_dataset=False,
        model_init_kwargs={"dtype": "float32"},
        # TRL's defaults that differ from grpo_kit's: bf16 autocast, gradient checkpointing, logging every 10 steps.
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        use_cpu=True,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    RecordingTrainer.advantages = []
    trainer = RecordingTrainer(
        model=str(model_dir),
        reward_funcs=digit_sum,
        args=args,
        train_dataset=datasets.Dataset.from_list([{"prompt": prompt} for prompt in prompts]),
        rollout_func=rollout_func,
    )
    trainer.train()
    return {
        "metrics": [entry for entry in trainer.state.log_history if "loss" in entry],
        "advantages": RecordingTrainer.advantages,
        "weights": {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()},
    }


# -------------------------------------------------------------------------------------------- the test ---


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: the tiny model's matrices are too small to share, and on a busy machine every OpenMP
    barrier waits for a core (a TRL step took 3 s instead of 0.1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One tiny model and prompt file for every case: each side loads its own copy of the model."""
    directory = tmp_path_factory.mktemp("whole-step")
    model_dir = build_tiny_model(directory / "model")
    prompts_file = directory / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in PROMPTS))
    return model_dir, prompts_file


@pytest.mark.parametrize("num_iterations", [1, 2])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss", ["dapo", "grpo", "dr_grpo", "cispo"])
def test_three_optimizer_steps_equal_trl(trl, shared, tmp_path, monkeypatch, loss, beta, num_iterations):
    model_dir, prompts_file = shared
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's warning that it is experimental
    ours = train_grpo_kit(model_dir, prompts_file, tmp_path / "grpo_kit", loss, beta, num_iterations)
    theirs = train_trl(trl, model_dir, PROMPTS, tmp_path / "trl", ours["config"])
    assert_same_steps(ours, theirs, model_dir, num_iterations)


@pytest.mark.parametrize("loss", ["dapo", "grpo"])  # bnpo's normaliser depends on the split, which differs (above)
def test_asymmetric_clipping_equals_trl(trl, shared, tmp_path, monkeypatch, loss):
    """epsilon_high apart from epsilon (DAPO's clip-higher). The second pass over each batch moves the ratios past
    1.05 and below 1.2: clipped if epsilon_high were taken for epsilon, not clipped as it is."""
    model_dir, prompts_file = shared
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    clip = ("loss.epsilon=0.05", "loss.epsilon_high=0.2")
    ours = train_grpo_kit(model_dir, prompts_file, tmp_path / "grpo_kit", loss, 0.0, 2, *clip)
    assert ours["config"].loss.epsilon_high == 0.2 != ours["config"].loss.epsilon
    theirs = train_trl(trl, model_dir, PROMPTS, tmp_path / "trl", ours["config"])
    assert_same_steps(ours, theirs, model_dir, 2)
    symmetric = train_grpo_kit(
        model_dir, prompts_file, tmp_path / "symmetric", loss, 0.0, 2, "loss.epsilon=0.05", "loss.epsilon_high=0.05"
    )
    assert any(
        not torch.allclose(weight, symmetric["weights"][name], atol=1e-5, rtol=0)
        for name, weight in ours["weights"].items()
    ), "the upper bound never bit: this test could not tell epsilon_high from epsilon"


def assert_same_steps(ours: dict, theirs: dict, model_dir, num_iterations: int) -> None:
    generation_batches = -(-STEPS // num_iterations)  # each is trained on for num_iterations steps
    assert len(ours["advantages"]) == len(theirs["advantages"]) == generation_batches
    torch.testing.assert_close(
        torch.tensor(ours["advantages"]), torch.tensor(theirs["advantages"]), atol=1e-5, rtol=1e-5
    )
    assert [line["step"] for line in ours["metrics"]] == [entry["step"] for entry in theirs["metrics"]] == [1, 2, 3]
    for step, (our_line, their_line) in enumerate(zip(ours["metrics"], theirs["metrics"]), start=1):
        generated = (step - 1) % num_iterations == 0
        for name in STEP_METRICS + (GENERATION_METRICS if generated else []):
            torch.testing.assert_close(
                torch.tensor(our_line[name]),
                torch.tensor(their_line[name]),
                atol=1e-5,
                rtol=1e-5,
                msg=lambda message, name=name, step=step: f"{name} at step {step}: {message}",
            )
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert ours["weights"].keys() == theirs["weights"].keys()
    for name, weight in ours["weights"].items():
        torch.testing.assert_close(
            weight, theirs["weights"][name], atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}"
        )
    moved = max((weight - initial[name]).abs().max().item() for name, weight in ours["weights"].items())
    assert moved > 1e-2, "three steps should move the weights well beyond the tolerance"
