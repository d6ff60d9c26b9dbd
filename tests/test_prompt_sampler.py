"""The order in which the training prompts are drawn."""

import datasets

from grpo_kit.rollout.prompts import PromptSampler


def test_unshuffled_prompts_come_in_the_datasets_order_epoch_after_epoch():
    """data.shuffle=false keeps the dataset's order, as TRL's shuffle_dataset=False does: a curriculum sorted from
    easy to hard is trained on from easy to hard."""
    dataset = datasets.Dataset.from_list([{"prompt": f"{index}+1="} for index in range(5)])
    sampler = PromptSampler(dataset, seed=0, shuffle=False)
    drawn = [row["prompt"] for _ in range(4) for row in sampler.draw(3)]
    assert drawn == [f"{index % 5}+1=" for index in range(12)]


def test_shuffled_prompts_cover_the_dataset_once_per_epoch():
    dataset = datasets.Dataset.from_list([{"prompt": f"{index}+1="} for index in range(6)])
    sampler = PromptSampler(dataset, seed=0, shuffle=True)
    first, second = sampler.draw(6), sampler.draw(6)
    assert (
        sorted(row["prompt"] for row in first) == sorted(row["prompt"] for row in second) == sorted(dataset["prompt"])
    )
