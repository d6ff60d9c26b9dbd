"""The one owner of a generation batch decides, when it makes the batch, which micro-batches get old log-probs at
generation and which keep those of their first training pass, and carries the weights' version and its divisors."""

import torch

import grpo_kit
from grpo_kit.contract.micro_batch import MicroBatch, RowSpans
from grpo_kit.testing import tiny_run
from grpo_kit.training.batches import GenerationBatch, GenerationBatches


def test_a_batch_spanning_two_steps_gets_old_log_probs_where_the_policy_moves_first(
    registry, tiny_model, tmp_path, monkeypatch
):
    made = []
    original = GenerationBatches.make

    def make(self, *args, **kwargs):
        batch = original(self, *args, **kwargs)
        made.append(
            (batch, set(batch.old_from_first_pass), [mb.old_per_token_logps is not None for mb in batch.micro_batches])
        )
        return batch

    monkeypatch.setattr(GenerationBatches, "make", make)
    overrides = tiny_run(  # 4 micro-batches of 4 completions per batch, 2 per optimizer step: one batch, two steps
        tiny_model,
        "+reward=accuracy",
        "trainer.per_device_train_batch_size=4",
        "algorithm.steps_per_generation=4",
        "trainer.gradient_accumulation_steps=2",
        "trainer.max_steps=4",
        "trainer.save_model=false",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path, registry)

    assert [batch.weight_version for batch, _, _ in made] == [0, 2]  # made at the start of steps 1 and 3
    for batch, awaiting, has_old in made:
        assert awaiting == {0, 1} and has_old == [False, False, True, True]  # the step before 2 and 3 moves it
        assert batch.old_from_first_pass == set()  # the first pass of 0 and 1 gave theirs
        assert all(mb.old_per_token_logps is not None for mb in batch.micro_batches)
        assert all(isinstance(mb.row_spans, RowSpans) for mb in batch.micro_batches)  # read once, for every pass
        tokens = sum(float(mb.completion_mask.sum()) for mb in batch.micro_batches)
        assert batch.reduction.num_items_in_batch == tokens
        assert (batch.reduction.gradient_accumulation_steps, batch.reduction.steps_per_generation) == (2, 4)


def test_a_saved_batch_loads_as_it_was():
    ids = torch.arange(6).view(2, 3)
    micro_batches = [MicroBatch(ids[:, :1], torch.ones(2, 1), ids, torch.ones(2, 3), torch.tensor([0.5, -0.5]))]
    reduction = grpo_kit.Reduction(5.0, 1, 1, 1, 3)
    batch = GenerationBatch(
        micro_batches, reduction, {"reward": 0.25}, weight_version=3, tokens=11, old_from_first_pass={0}
    )
    loaded = GenerationBatch.from_state_dict(batch.state_dict(), torch.device("cpu"))
    assert (loaded.reduction, loaded.metrics, loaded.weight_version, loaded.tokens) == (
        reduction,
        {"reward": 0.25},
        3,
        11,
    )
    assert loaded.old_from_first_pass == {0}
    torch.testing.assert_close(
        [batch.state_dict() for batch in loaded.micro_batches], [batch.state_dict() for batch in micro_batches]
    )
