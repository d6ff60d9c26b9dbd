"""docs/grpo_in_one_file.py computes what grpo_kit's trainer computes: from the embedded model, on the same prompts
and completions, two optimizer steps of each give the same weights within 1e-6, and the same rewards, losses and
gradient norms.

The trainer records its completions (rollout_files.save=true), and the one-file code trains on them in place of sampling
its own. The settings make each part of the step count: two micro-batches per step (the token mean must count the
whole generation batch's tokens), two passes over the batch (the second step is off-policy, and a third of its
tokens are clipped), an upper clip range of its own (DAPO's clip-higher), weight decay, a first gradient norm above
max_grad_norm, and a learning rate that falls from step to step. The losses and gradient norms catch a gradient of
the wrong scale, which gradient clipping and Adam's normalisation would hide from the weights.

AdamW's epsilon is 1e-5: at 1e-8, Adam turns the float rounding of a near-zero gradient into a whole step, and the
two sides add the same numbers in different orders (the trainer shuffles the batch its own way and groups it by
length). At 1e-8 their weights differ by up to 7e-6, at 1e-5 by about 1e-7.
"""

import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grpo_kit
from grpo_kit.embedded import sums
from grpo_kit.rollout.replay import RolloutReplay

ONE_FILE = Path(__file__).resolve().parents[1] / "docs" / "grpo_in_one_file.py"
# The one-file Config's fields that the test sets, and the trainer's option for each.
SETTINGS = {
    "num_generations": (8, "generation.num_generations"),
    "per_device_train_batch_size": (16, "trainer.per_device_train_batch_size"),
    "gradient_accumulation_steps": (2, "trainer.gradient_accumulation_steps"),
    "num_iterations": (2, "algorithm.num_iterations"),
    "epsilon_high": (0.28, "loss.epsilon_high"),
    "weight_decay": (0.1, "trainer.weight_decay"),
    "adam_epsilon": (1e-5, "trainer.adam_epsilon"),
    "warmup_ratio": (0.0, "trainer.warmup_ratio"),  # the embedded default's would make the first step's rate 0
    "max_steps": (2, "trainer.max_steps"),
    "seed": (3, "seed"),
}


def load_one_file():
    spec = importlib.util.spec_from_file_location("grpo_in_one_file", ONE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_one_file_defaults_are_the_embedded_default_run(registry):
    config, cfg = load_one_file().Config(), grpo_kit.compose(["+reward=accuracy"], registry)
    t, generation = cfg.trainer, cfg.generation
    assert (cfg.loss.name, cfg.importance_sampling.name, cfg.advantage.name, cfg.rollout_correction.name) == (
        "dapo",
        "token",
        "group",
        "none",
    )
    assert (cfg.algorithm.beta, t.optim, t.lr_scheduler_type, t.warmup_steps) == (0.0, "adamw_torch_fused", "linear", 0)
    assert (cfg.loss.epsilon, cfg.loss.epsilon_high or cfg.loss.epsilon) == (config.epsilon_low, config.epsilon_high)
    assert (generation.num_generations, generation.max_completion_length, generation.temperature) == (
        config.num_generations,
        config.max_completion_length,
        config.temperature,
    )
    sampling = (generation.top_p, generation.top_k, generation.min_p, generation.repetition_penalty)
    assert sampling == (1.0, None, None, 1.0)  # sampling from the model's own distribution
    assert (t.per_device_train_batch_size, t.gradient_accumulation_steps, cfg.algorithm.num_iterations) == (
        config.per_device_train_batch_size,
        config.gradient_accumulation_steps,
        config.num_iterations,
    )
    assert (cfg.algorithm.steps_per_generation or t.gradient_accumulation_steps) == config.steps_per_generation
    assert (t.learning_rate, (t.adam_beta1, t.adam_beta2), t.adam_epsilon, t.weight_decay, t.max_grad_norm) == (
        config.learning_rate,
        config.adam_betas,
        config.adam_epsilon,
        config.weight_decay,
        config.max_grad_norm,
    )
    assert (t.max_steps, t.warmup_ratio, cfg.seed) == (config.max_steps, config.warmup_ratio, config.seed)


def test_two_steps_of_the_one_file_code_give_the_trainers_weights(registry, tmp_path):
    one_file = load_one_file()
    config = one_file.Config(**{name: value for name, (value, _) in SETTINGS.items()})
    cfg = grpo_kit.compose(
        [
            "+reward=accuracy",
            "+loss=dapo",
            *(f"{option}={value}" for value, option in SETTINGS.values()),
            "rollout_files.save=true",
            "trainer.save_model=true",
            "trainer.progress_bar=false",
            "eval.split=null",
            "eval.on_start=false",
            "trainer.torch_threads=1",
        ],
        registry,
    )
    run_dir = grpo_kit.train(cfg, tmp_path / "run", registry)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["grad_norm"] > config.max_grad_norm and logged[1]["clip_ratio/region_mean"] > 0.1
    generation_batch_size = config.per_device_train_batch_size * config.steps_per_generation
    replay = RolloutReplay(run_dir, config.num_generations, generation_batch_size)
    recorded = [replay.next() for _ in replay.files]
    assert len(recorded) == 1  # one generation batch, trained on by both steps

    def replayed(model, tokenizer, prompts, config):  # the trainer's completions, in place of new samples
        scored = recorded[len(replayed.calls)]
        replayed.calls.append(prompts)
        padded = tokenizer.pad({"input_ids": scored.prompt_ids}, padding_side="left", return_tensors="pt")
        generated = scored.generated
        return {
            "prompt_ids": padded["input_ids"],
            "prompt_mask": padded["attention_mask"],
            "completion_ids": generated.completion_ids,
            "completion_mask": generated.completion_mask,
        }

    replayed.calls = []
    scores = []

    def accuracy(**batch):
        scores.extend(one_file.accuracy(**batch))
        return scores[-len(batch["completions"]) :]

    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(sums.model_path())
    model = AutoModelForCausalLM.from_pretrained(sums.model_path(), dtype=torch.float32)
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    prompt_rows = iter([scored.rows[:: config.num_generations] for scored in recorded])
    history = one_file.train(model, tokenizer, prompt_rows, config, generate=replayed, reward=accuracy)

    assert [prompt for prompts in replayed.calls for prompt in prompts] == [
        row["prompt"] for scored in recorded for row in scored.rows[:: config.num_generations]
    ]
    assert scores == [reward for scored in recorded for reward in scored.rewards.tolist()]
    for ours, theirs in zip(history, logged, strict=True):
        assert ours["reward"] == theirs["reward"]
        assert abs(ours["loss"] - theirs["loss"]) < 1e-6
        assert abs(ours["grad_norm"] - theirs["grad_norm"]) < 1e-5 * theirs["grad_norm"]
    trained = AutoModelForCausalLM.from_pretrained(run_dir / "model", dtype=torch.float32).state_dict()
    ours = model.state_dict()
    assert trained.keys() == ours.keys()
    assert max((trained[name] - start[name]).abs().max().item() for name in ours) > 1e-3  # the steps moved it
    for name, tensor in ours.items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
