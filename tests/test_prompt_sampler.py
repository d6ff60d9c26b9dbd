"""The order in which the training prompts are drawn, by the run's sampler plugin."""

import json

import datasets
import pytest
import torch
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.plugins.registry import Registry
from grpo_kit.rollout.prompts import PromptSampler
from grpo_kit.testing import tiny_run


def uniform():
    return Registry().build("sampler", "uniform", {})


def test_unshuffled_prompts_come_in_the_datasets_order_epoch_after_epoch():
    """data.shuffle=false keeps the dataset's order, as TRL's shuffle_dataset=False does: a curriculum sorted from
    easy to hard is trained on from easy to hard."""
    dataset = datasets.Dataset.from_list([{"prompt": f"{index}+1="} for index in range(5)])
    sampler = PromptSampler(dataset, uniform(), seed=0, shuffle=False)
    drawn = [row["prompt"] for _ in range(4) for row in sampler.draw(3)]
    assert drawn == [f"{index % 5}+1=" for index in range(12)]


def test_shuffled_prompts_cover_the_dataset_once_per_epoch():
    dataset = datasets.Dataset.from_list([{"prompt": f"{index}+1="} for index in range(6)])
    sampler = PromptSampler(dataset, uniform(), seed=0, shuffle=True)
    first, second = sampler.draw(6), sampler.draw(6)
    assert (
        sorted(row["prompt"] for row in first) == sorted(row["prompt"] for row in second) == sorted(dataset["prompt"])
    )


def test_every_process_draws_its_share_of_one_decision():
    """Two processes' samplers, told the same (gathered) groups, keep deciding alike: their shares of each draw
    are disjoint and together the one draw a single sampler makes."""
    dataset = datasets.Dataset.from_list([{"prompt": f"{index}+1="} for index in range(12)])

    def pool():
        return Registry().build("sampler", "difficulty_pool", {"set_aside_passes": 0})

    shares = [PromptSampler(dataset, pool(), 0, True, rank, 2) for rank in (0, 1)]
    whole = PromptSampler(dataset, pool(), 0, True)
    for round_ in range(4):
        drawn = [share.draw_indexed(3)[0] for share in shares]
        every = whole.draw_indexed(6)[0]
        assert sorted(drawn[0] + drawn[1]) == sorted(every) and not set(drawn[0]) & set(drawn[1])
        gathered = drawn[0] + drawn[1]  # in process order, as the rollout gathers them
        rewards = torch.tensor([[float((index + round_) % 3 == 0)] * 4 for index in gathered])
        for sampler in [*shares, whole]:
            sampler.observe(gathered, rewards)


def test_a_run_logs_what_its_sampler_did(tiny_model, tmp_path):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "+sampler=skip_flat_groups", "sampler.groups=1"))
    grpo_kit.train(cfg, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all({"sampler/flat_group_share", "sampler/skipped"} <= line.keys() for line in lines if line["step"])


def test_a_run_resumed_with_a_sampler_that_reads_rewards_goes_on_as_the_unbroken_one(
    tiny_model, tmp_path, digits_registry
):
    """The pools come back from the checkpoint: the resumed run draws, and so trains, as the unbroken one."""
    overrides = tiny_run(
        tiny_model,
        "+reward=digits",  # a reward an untrained model earns, so that pass rates differ and the weights move
        "+sampler=difficulty_pool",
        "sampler.correct_threshold=0.3",
        "sampler.set_aside_passes=0",
        "sampler.easy_share=0",
        "sampler.medium_share=0",
        "sampler.hard_share=1",  # scored prompts come back: forgotten pools would draw unscored ones instead
        "trainer.max_steps=4",
        "trainer.save_steps=1",
        "trainer.save_total_limit=4",
    )
    runs = []
    for name, extra in (("unbroken", []), ("resumed", ["trainer.resume=RUN/checkpoints/step-000002"])):
        extra = [override.replace("RUN", str(tmp_path / "unbroken")) for override in extra]
        runs.append(
            grpo_kit.train(grpo_kit.compose([*overrides, *extra], digits_registry), tmp_path / name, digits_registry)
        )
    weights = [load_file(run / "model" / "model.safetensors") for run in runs]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    logged = [
        {line["step"]: line for line in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
        for run in runs
    ]
    for step in (3, 4):
        for name in ("sampler/pool/hard", "sampler/pool/medium", "reward"):
            assert logged[1][step][name] == logged[0][step][name], (step, name)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+sampler=difficulty_pool", "algorithm.max_staleness=1"], "algorithm.max_staleness=1 draws prompts ahead"),
        (["+sampler=curriculum", "sampler.column=a", "rollout_files.replay=/nowhere"], "would draw nothing"),
        (["+sampler=nonesuch"], "No sampler plugin named 'nonesuch'"),
        (["+sampler=curriculum", "sampler.colum=a"], "sampler.column"),
    ],
)
def test_samplers_that_cannot_work_are_refused(tiny_model, overrides, message):
    with pytest.raises((ConfigError, PluginError), match=message):
        grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", *overrides))
