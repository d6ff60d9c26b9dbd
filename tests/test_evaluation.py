"""Evaluation on held-out prompts: when it runs, what it logs, and that it leaves training untouched."""

import importlib
import json
import math
import random
import re

import pytest
import torch
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.config.schema import DataConfig, EvalConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.embedded import sums as embedded
from grpo_kit.embedded import tool_use as embedded_tool_use
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.rollout.evaluation import load_eval_prompts
from grpo_kit.rollout.prompts import load_prompts
from grpo_kit.rollout.sampled_metrics import extracted_answer, majority_is_correct, pass_at_k, sampled_metrics
from grpo_kit.testing import tiny_run


def run(tiny_model, *extra):
    return tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=4", *extra)


def logged(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def eval_file(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+1=", "solution": str(a + 1)}) + "\n" for a in range(6)))
    return path


def test_eval_metrics_are_logged_every_eval_steps_and_at_the_end(registry, tiny_model, tmp_path, eval_file):
    overrides = run(tiny_model, f"eval.path={eval_file}", "eval.steps=3", "eval.on_start=true", "trainer.max_steps=4")
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    lines = logged(tmp_path / "run")
    evaluated = [line["step"] for line in lines if "eval/reward" in line]
    assert evaluated == [0, 3, 4]
    assert set(lines[0]) == {"step", *(name for name in lines[-1] if name.startswith("eval/"))}  # before training
    last = lines[-1]
    assert 0.0 <= last["eval/reward"] <= 1.0
    assert last["eval/rewards/accuracy/mean"] == last["eval/reward"]
    assert {"eval/reward_std", "eval/completions/mean_length", "eval/completions/clipped_ratio"} <= set(last)


def test_evaluating_does_not_change_what_is_trained(registry, tiny_model, tmp_path, eval_file):
    no_eval = ["eval.split=null"]  # the embedded task's preset evaluates
    for name, extra in [
        ("plain", no_eval),
        ("evaluated", [f"eval.path={eval_file}", "eval.steps=1", "eval.on_start=true"]),
    ]:
        grpo_kit.train(grpo_kit.compose(run(tiny_model, *extra), registry), tmp_path / name, registry)
    plain = load_file(tmp_path / "plain" / "model" / "model.safetensors")
    evaluated = load_file(tmp_path / "evaluated" / "model" / "model.safetensors")
    assert plain.keys() == evaluated.keys()
    assert all(torch.equal(plain[name], evaluated[name]) for name in plain)
    assert [line["reward"] for line in logged(tmp_path / "plain")] == [
        line["reward"] for line in logged(tmp_path / "evaluated") if line["step"] > 0
    ]


def test_eval_generations_and_batch_size_are_its_own(local_plugin, tiny_model, tmp_path, eval_file):
    module = local_plugin(
        "batch_sizes_reward",
        """
        import grpo_kit

        SIZES = []

        def batch_sizes(prompts, completions, completion_ids, **columns):
            SIZES.append(len(completions))
            return [0.0] * len(completions)

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("batch_sizes", batch_sizes)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module]))
    overrides = tiny_run(
        tiny_model,
        "+reward=batch_sizes",
        f"eval.path={eval_file}",
        "eval.num_examples=5",
        "eval.num_generations=3",
        "eval.batch_size=2",
        "eval.on_start=false",
        "trainer.max_steps=1",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    sizes = importlib.import_module(module).SIZES
    assert sizes == [8, 2 * 3, 2 * 3, 1 * 3]  # one training batch, then 5 eval prompts in batches of 2, 3 each


def embedded_eval_prompts(task: str, split: str) -> list[str]:
    rows = load_eval_prompts(EvalConfig(split=split, num_examples=10_000), DataConfig(embedded=task))
    return [question(prompt) for prompt in rows["prompt"]]


def question(prompt) -> str:
    return prompt if isinstance(prompt, str) else prompt[0]["content"]  # text, or chat messages


def pretraining_questions(task: str) -> set[str]:
    """The questions of every example the embedded model `task` is pretrained on, drawn as its pretraining draws
    them."""
    rng = random.Random(embedded.MODEL_SEED)
    if task == "sums":
        texts = (embedded._noisy_example(rng) for _ in range(embedded.PRETRAIN_STEPS * embedded.PRETRAIN_BATCH))
        return {text[: text.index("=") + 1] for text in texts}
    count = embedded_tool_use.PRETRAIN_STEPS * embedded_tool_use.PRETRAIN_BATCH
    return {embedded_tool_use.noisy_conversation(rng)[0][0]["content"] for _ in range(count)}


@pytest.mark.parametrize("task", ["sums", "tool_use"])
def test_the_embedded_eval_set_is_never_pretrained_or_trained_on(task):
    held_out = embedded_eval_prompts(task, "test")
    trained = {question(prompt) for prompt in load_prompts(DataConfig(embedded=task))["prompt"]}
    assert len(held_out) == len(set(held_out)) == {"sums": 20, "tool_use": 100}[task]
    assert not set(held_out) & trained
    assert not set(held_out) & pretraining_questions(task)
    assert set(embedded_eval_prompts(task, "train")) <= trained


def test_the_embedded_sums_are_split_into_held_out_and_trained_on():
    held_out, trained = embedded_eval_prompts("sums", "test"), embedded_eval_prompts("sums", "train")
    assert sorted(held_out + trained) == sorted(f"{a}+{b}=" for a in range(10) for b in range(10))
    assert {"prompt": "3+4=", "solution": "7"} in load_eval_prompts(EvalConfig(split="train"), DataConfig())


def test_an_embedded_eval_split_other_than_test_or_train_is_refused():
    with pytest.raises(ConfigError, match="eval.split=validation is no split of the embedded task: choose test"):
        load_eval_prompts(EvalConfig(split="validation"), DataConfig())


def test_eval_split_of_a_data_file_is_refused_before_training(registry, tiny_model, tmp_path, eval_file):
    cfg = grpo_kit.compose(run(tiny_model, f"data.path={eval_file}", "eval.split=test"), registry)
    with pytest.raises(ValueError, match="eval.path=FILE"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_eval_set_without_a_reward_column_is_refused_before_training(registry, tiny_model, tmp_path):
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    cfg = grpo_kit.compose(run(tiny_model, f"eval.path={eval_file}"), registry)
    with pytest.raises(ValueError, match="solution"):
        grpo_kit.train(cfg, tmp_path / "run", registry)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# pass@k and maj@k (eval.num_samples), and named eval sets (eval.sets.NAME) --------------------------------------


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2), by hand
    assert pass_at_k(5, 0, 2) == 0.0  # nothing correct
    assert pass_at_k(5, 4, 2) == 1.0  # n - c < k: every pair holds a correct one
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - math.comb(197, 100) / math.comb(200, 100))


def test_maj_at_k_votes_among_extracted_answers():
    pattern = re.compile(r"answer: (\d+)")
    assert extracted_answer(" 7 ", None) == "7"
    assert extracted_answer("answer: 3 then answer: 4", pattern) == "4"  # the last match, its group
    assert extracted_answer([{"role": "assistant", "content": "answer: 5"}], pattern) == "5"
    assert extracted_answer("no idea", pattern) is None
    assert majority_is_correct(["4", "5", "4"], [True, False, True])
    assert not majority_is_correct(["5", "4", None, None], [False, True, False, False])  # a tie: 5 came first
    assert not majority_is_correct([None, None], [True, True])  # nothing voted
    correct = torch.tensor([[1, 1], [0, 0], [0, 0], [1, 1]], dtype=torch.bool)  # two prompts, n=2; 1 reward
    metrics = sampled_metrics(correct, ["a", "b", "c", "d"], 2, [1, 2], ["acc"], "eval/x/")
    assert metrics == {
        "eval/x/pass@1": 0.5,
        "eval/x/pass@2": 1.0,
        "eval/x/maj@2": 0.5,  # ties: the first answer wins, right for prompt 0, wrong for prompt 1
        "eval/x/rewards/acc/pass@1": 0.5,
        "eval/x/rewards/acc/pass@2": 1.0,
        "eval/x/rewards/acc/maj@2": 0.5,
    }


def test_pass_at_k_is_logged_for_each_eval_set(registry, tiny_model, tmp_path, eval_file):
    overrides = run(
        tiny_model,
        f"eval.path={eval_file}",
        f"eval.sets.more.path={eval_file}",
        "eval.sets.more.num_examples=2",
        "eval.num_samples=3",
        "eval.pass_at=[1,3]",
        "eval.temperature=0.5",
        "trainer.max_steps=1",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    last = logged(tmp_path / "run")[-1]
    for prefix in ("eval/", "eval/more/"):
        assert {f"{prefix}{name}" for name in ("reward", "pass@1", "pass@3", "maj@3")} <= set(last)
        assert last[f"{prefix}pass@1"] == pytest.approx(last[f"{prefix}reward"])  # accuracy is 0 or 1
        assert last[f"{prefix}pass@1"] <= last[f"{prefix}pass@3"]
        assert last[f"{prefix}rewards/accuracy/pass@3"] == last[f"{prefix}pass@3"]
    assert "eval/pass@2" not in last and "eval/maj@1" not in last


@pytest.mark.parametrize(
    "extra, message",
    [
        (["eval.num_samples=4", "eval.pass_at=[1,8]"], r"1 <= k <= eval.num_samples=4 \(k=8 is not\)"),
        (["eval.pass_at=[1]"], "eval.num_samples=N turns on"),
        (["eval.num_samples=4", "eval.num_generations=2"], "drop eval.num_generations"),
        (["eval.temperature=0"], "eval.temperature=0.0 must be positive"),
        (["eval.sets.rewards.path=x.jsonl"], "name the set otherwise"),
        (["eval.sets.more.pth=x.jsonl"], "eval.sets.more names no file"),
        (["eval.sets.more.path=x.jsonl", "eval.sets.more.splitt=test"], "eval.sets.more.splitt is not an option"),
    ],
)
def test_bad_pass_at_k_settings_are_refused_when_composed(registry, extra, message):
    with pytest.raises(ConfigError, match=message):
        grpo_kit.compose(["+reward=accuracy", *extra], registry)


def test_eval_sampling_settings_need_a_backend_that_takes_them(local_plugin, tiny_model, tmp_path, eval_file):
    module = local_plugin(
        "fixed_sampling_generation",
        """
        import grpo_kit
        from grpo_kit_transformers.configs import TransformersGenerationConfig
        from grpo_kit_transformers.generation import TransformersGeneration

        class FixedSampling(TransformersGeneration):
            def sampling(self, temperature, top_p):  # the protocol's default: the run's settings only
                return None

        @grpo_kit.hookimpl
        def register_generations(register):
            register("fixed_sampling", FixedSampling, TransformersGenerationConfig, samples_from_policy=True)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module]))
    overrides = run(tiny_model, "generation=fixed_sampling", f"eval.path={eval_file}", "eval.top_p=0.9")
    with pytest.raises(ConfigError, match="samples only with the run's"):
        grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
