"""Less padding and fewer passes, the same gradient up to float rounding: micro-batches grouped by length and cut
to their own longest completion, a micro-batch of mixed lengths run as two forward passes, rows moved left so that
no attention mask is needed, old log-probs taken from the first training pass."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model.fast import causal_attention
from grpo_kit.model.fast.length_groups import length_groups
from grpo_kit.model.fast.switches import SpeedUps, use_speed_ups
from grpo_kit.model.logprobs import (
    OutputHead,
    _logps_and_entropies_of_logits,
    last_hidden_states,
    model_inputs,
    per_token_logps_and_entropies,
)
from grpo_kit.objective.policy_loss import build_policy_loss
from grpo_kit.testing import tiny_run
from grpo_kit.training.batches import group_by_length, moves_before_use, split
from grpo_kit.training.optimization import Optimization

TOLERANCE = 1e-5  # relative, on each parameter's gradient: the split changes only the order of float sums


def generation_batch(vocab_size: int, size: int = 16, prompt_length: int = 3, length: int = 12, seed: int = 0):
    """A generation batch as the rollout hands it over: completion lengths from 1 to `length`, some truncated."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (size,), generator=generator)
    lengths[0] = length
    completion_mask = (torch.arange(length) < lengths.unsqueeze(1)).long()
    completion_ids = torch.randint(2, vocab_size, (size, length), generator=generator) * completion_mask
    prompt_mask = torch.ones(size, prompt_length, dtype=torch.long)
    prompt_mask[1::3, 0] = 0  # left padding
    return MicroBatch(
        prompt_ids=torch.randint(2, vocab_size, (size, prompt_length), generator=generator) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        advantages=torch.randn(size, generator=generator),
    )


def test_a_step_keeps_its_completions_and_each_micro_batch_is_cut_to_its_longest():
    batch = generation_batch(vocab_size=20, size=24)
    torch.manual_seed(0)
    plain = split(batch, steps_per_generation=6, accumulation=3, by_length=False)
    torch.manual_seed(0)
    grouped = split(batch, steps_per_generation=6, accumulation=3, by_length=True)

    def rows(micro_batches):  # each micro-batch's rows, as the advantages identify them
        return [set(mb.advantages.tolist()) for mb in micro_batches]

    for step in range(2):  # the same completions in each optimizer step's 3 micro-batches
        assert set().union(*rows(plain)[step * 3 : step * 3 + 3]) == set().union(
            *rows(grouped)[step * 3 : step * 3 + 3]
        )
    for micro_batch in grouped[:3]:  # sorted by length within the step
        lengths = micro_batch.completion_mask.sum(1)
        assert micro_batch.completion_ids.shape[1] == lengths.max() == micro_batch.completion_mask.shape[1]
    step_lengths = [mb.completion_mask.sum(1) for mb in grouped[:3]]
    assert step_lengths[0].max() <= step_lengths[1].min() and step_lengths[1].max() <= step_lengths[2].min()
    for micro_batch in plain:  # cut to its own longest even when not grouped; prompts keep the batch's padding
        assert micro_batch.completion_mask[:, -1].any() and micro_batch.prompt_ids.shape[1] == 3


def step_gradient(policy_loss, model, micro_batches, reduction):
    model.zero_grad(set_to_none=True)
    for micro_batch in micro_batches:
        policy_loss(model, micro_batch, reduction).loss.backward()
    return {name: parameter.grad.clone() for name, parameter in model.named_parameters()}


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo", "cispo", "luspo", "sapo", "vespo"])
def test_grouping_by_length_keeps_the_gradient_of_the_step(registry, tiny_model, loss):
    cfg = grpo_kit.compose(tiny_run(tiny_model, f"+loss={loss}", "algorithm.beta=0.0"), registry)
    objective = grpo_kit.build_objective(cfg, registry)
    assert group_by_length(cfg, objective.loss, steps_per_generation=4)
    policy_loss = build_policy_loss(cfg, objective)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = generation_batch(model.config.vocab_size, size=16)
    reduction = grpo_kit.Reduction(float(batch.completion_mask.sum()), 4, 4, 1, objective.max_completion_length)
    torch.manual_seed(0)
    plain = step_gradient(policy_loss, model, split(batch, 4, 4, by_length=False), reduction)
    torch.manual_seed(0)
    grouped_batches = split(batch, 4, 4, by_length=True)
    widths = [mb.completion_ids.shape[1] for mb in grouped_batches]
    assert sum(widths) < 4 * 12, "grouping saved no padding: the test would not mean anything"
    grouped = step_gradient(policy_loss, model, grouped_batches, reduction)
    for name, gradient in plain.items():
        scale = gradient.abs().max().clamp(min=1e-8)
        difference = (grouped[name] - gradient).abs().max() / scale
        assert difference <= TOLERANCE, f"{name}: the grouped step's gradient differs by {difference:.2e} (relative)"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["+loss=bnpo"], "does not declare accumulation_invariant"),
        (["algorithm.top_entropy_quantile=0.2"], "quantile of each micro-batch"),
        (["algorithm.entropy_coef=0.01"], "mean entropy"),
        (["algorithm.steps_per_generation=3", "trainer.gradient_accumulation_steps=2"], "not a whole number of steps"),
    ],
)
def test_grouping_is_off_where_it_would_change_the_gradient_and_refused_if_asked(registry, overrides, reason):
    cfg = grpo_kit.compose(["+reward=accuracy", *overrides], registry)
    objective = grpo_kit.build_objective(cfg, registry)
    steps = cfg.algorithm.steps_per_generation or cfg.trainer.gradient_accumulation_steps
    assert not group_by_length(cfg, objective.loss, steps)
    cfg.trainer.group_by_length = True
    with pytest.raises(ConfigError, match=reason):
        group_by_length(cfg, objective.loss, steps)
    cfg.trainer.group_by_length = False
    assert not group_by_length(cfg, objective.loss, steps)


def test_which_micro_batches_are_trained_on_after_the_policy_moved():
    assert moves_before_use(0, steps_per_generation=4, accumulation=4) == [False] * 4  # one step per batch
    assert moves_before_use(0, steps_per_generation=4, accumulation=2) == [False, False, True, True]
    assert moves_before_use(4, steps_per_generation=2, accumulation=4) == [False, False]  # two batches per step
    assert moves_before_use(6, steps_per_generation=3, accumulation=2) == [False, False, True]


def test_the_first_pass_gives_the_old_log_probs_a_separate_forward_would(registry, tiny_model):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+loss=dapo"), registry)
    objective = grpo_kit.build_objective(cfg, registry)
    policy_loss = build_policy_loss(cfg, objective)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    micro_batch = split(generation_batch(model.config.vocab_size, size=8), 1, 1, by_length=True)[0]  # the whole batch
    model.eval()
    with torch.no_grad():
        separate, _ = policy_loss.logps(model, micro_batch)
    model.train()
    reduction = grpo_kit.Reduction.whole_batch(micro_batch.completion_mask, objective.max_completion_length)
    out = policy_loss(model, micro_batch, reduction)
    assert not out.per_token_logps.requires_grad
    torch.testing.assert_close(out.per_token_logps, separate, atol=1e-6, rtol=0)


def test_a_run_with_two_iterations_trains_again_on_the_log_probs_of_its_first_pass(
    registry, tiny_model, tmp_path, monkeypatch
):
    """Each micro-batch is trained on twice (num_iterations=2, one step per generation batch): the second time,
    its old log-probs are what the policy that generated it gives, which a separate pass recomputes here."""
    seen = {}  # the micro-batch (its completions) -> its log-probs under the generating policy
    checked = []
    original = Optimization.train_on

    def train_on(self, micro_batch, reduction, finite, ends_step, **instruments):
        key = str(micro_batch.completion_ids.tolist())
        if key not in seen:
            assert micro_batch.old_per_token_logps is None  # the first pass computes them
            with torch.no_grad():
                seen[key], _ = self.policy_loss.logps(self.model, micro_batch)
        else:
            torch.testing.assert_close(micro_batch.old_per_token_logps, seen[key], atol=1e-6, rtol=0)
            checked.append(key)
        return original(self, micro_batch, reduction, finite, ends_step, **instruments)

    monkeypatch.setattr(Optimization, "train_on", train_on)
    overrides = tiny_run(
        tiny_model,
        "+reward=accuracy",
        "algorithm.num_iterations=2",
        "trainer.gradient_accumulation_steps=2",
        "trainer.max_steps=4",
        "trainer.save_model=false",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path, registry)
    assert len(checked) == 4  # 2 generation batches x 2 micro-batches, each trained on a second time


def test_a_micro_batch_of_mixed_lengths_runs_as_two_forward_passes_with_the_same_values(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = generation_batch(model.config.vocab_size, size=8, length=12)
    batch.completion_mask[1::2, 3:] = 0  # four short completions between four up to 12 tokens long
    groups = length_groups(batch.completion_mask, prompt_length=3)
    assert len(groups) == 2 and set(groups[0].tolist()) == {1, 3, 5, 7}

    def values_and_gradients(forward):
        model.zero_grad(set_to_none=True)
        logps, entropies = forward(batch)
        (logps * batch.completion_mask).sum().backward()
        return (
            logps * batch.completion_mask,
            entropies * batch.completion_mask,
            [p.grad.clone() for p in model.parameters()],
        )

    grouped = values_and_gradients(lambda b: per_token_logps_and_entropies(model, b, temperature=0.9))
    whole = values_and_gradients(lambda b: _logps_and_entropies_of_logits(model, b, 0.9, entropy_grad=False))
    torch.testing.assert_close(grouped[0], whole[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(grouped[1], whole[1], atol=1e-5, rtol=0)
    for grouped_gradient, whole_gradient in zip(grouped[2], whole[2]):
        torch.testing.assert_close(grouped_gradient, whole_gradient, atol=1e-5, rtol=1e-5)


def test_similar_lengths_stay_one_forward_pass():
    mask = (torch.arange(12) < torch.tensor([12, 11, 10, 12, 9, 12, 11, 10]).unsqueeze(1)).long()
    assert len(length_groups(mask, prompt_length=3)) == 1


def masked_pass(model, batch, temperature: float = 1.0):  # (B, T): one pass with the attention mask, as TRL runs it
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    length = batch.completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -length - 1 : -1] / temperature
    return logits.log_softmax(dim=-1).gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


def logps_and_gradients(model, batch, forward):
    model.zero_grad(set_to_none=True)
    logps = forward(batch) * batch.completion_mask
    logps.sum().backward()
    return logps, [parameter.grad.clone() for parameter in model.parameters()]


def assert_same_values_and_gradients(actual, expected):
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=0)
    for actual_gradient, expected_gradient in zip(actual[1], expected[1], strict=True):
        torch.testing.assert_close(actual_gradient, expected_gradient, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [10, 250])  # 254 tokens: the CPU's chunked causal attention (causal_attention.py)
def test_rows_moved_left_need_no_attention_mask_and_give_the_masked_pass_values_and_gradients(
    tiny_model, length, monkeypatch
):
    chunked_passes = []
    real = causal_attention.ChunkedCausalAttention.apply
    monkeypatch.setattr(
        causal_attention.ChunkedCausalAttention, "apply", lambda *args: chunked_passes.append(1) or real(*args)
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.max_position_embeddings = 512  # RoPE's positions go on past the tiny model's 128
    batch = generation_batch(model.config.vocab_size, size=8, prompt_length=4, length=length)
    batch.prompt_mask[2, :3] = 0  # padding of 0, 1 and 3 tokens before the prompts
    batch.completion_mask[5] = 0  # a truncated completion that DAPO's masking took out
    inputs, shift, longest_shift = model_inputs(model, batch)
    assert "attention_mask" not in inputs and shift.tolist() == [0, 1, 3, 0, 1, 0, 0, 1] and longest_shift == 3
    head = OutputHead(model)

    def from_hidden_states(part):
        logits = head(last_hidden_states(model, part, head)) / 0.7
        return logits.log_softmax(dim=-1).gather(-1, part.completion_ids.unsqueeze(-1)).squeeze(-1)

    expected = logps_and_gradients(model, batch, lambda part: masked_pass(model, part, 0.7))
    plain = logps_and_gradients(model, batch, lambda part: _logps_and_entropies_of_logits(model, part, 0.7, False)[0])
    assert_same_values_and_gradients(plain, expected)
    assert_same_values_and_gradients(logps_and_gradients(model, batch, from_hidden_states), expected)
    assert bool(chunked_passes) == (length == 250)


@pytest.mark.parametrize("case", ["padding inside a row", "positions past the model's last", "a long move"])
def test_the_masked_pass_stays_where_moving_rows_would_not_do(tiny_model, case):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = generation_batch(model.config.vocab_size, size=6, prompt_length=4, length=8)
    batch.prompt_mask[2, :3] = 0
    max_shift = None
    if case == "padding inside a row":
        batch.completion_mask[0, 2] = 0  # a token the completion holds but the model must not see
    elif case == "positions past the model's last":
        model.config.max_position_embeddings = 4 + 8 + 2  # the moved padding would reach position 14
    else:
        max_shift = 2
    inputs, shift, longest_shift = model_inputs(model, batch, max_shift=max_shift)
    assert "attention_mask" in inputs and not shift.any() and longest_shift == 0
    if case == "padding inside a row":
        plain = logps_and_gradients(
            model, batch, lambda part: _logps_and_entropies_of_logits(model, part, 1.0, False)[0]
        )
        assert_same_values_and_gradients(
            plain, logps_and_gradients(model, batch, lambda part: masked_pass(model, part))
        )


@pytest.mark.parametrize("chunk_size", [None, 64])  # the full logits, and the chunked logits from hidden states
@pytest.mark.parametrize("switched_off", ["mask_free_passes", "passes_by_length", "cpu_chunked_attention"])
def test_each_speed_up_switched_off_gives_the_plain_values_without_it(
    tiny_model, switched_off, chunk_size, monkeypatch
):
    """Rows of mixed lengths, some left-padded, long enough for the chunked attention: every speed-up applies, and
    the model's switches take each one out on its own, leaving the masked pass's values and gradients."""
    seen = {"masked passes": 0, "passes": 0, "chunked attention": 0}
    real = causal_attention.ChunkedCausalAttention.apply

    def chunked_attention(*args):
        seen["chunked attention"] += 1
        return real(*args)

    def record(module, args, kwargs):
        seen["passes"] += 1
        seen["masked passes"] += kwargs.get("attention_mask") is not None

    monkeypatch.setattr(causal_attention.ChunkedCausalAttention, "apply", chunked_attention)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.max_position_embeddings = 512  # RoPE's positions go on past the tiny model's 128
    model.register_forward_pre_hook(record, with_kwargs=True)
    batch = generation_batch(model.config.vocab_size, size=8, prompt_length=4, length=250)
    batch.completion_mask[1::2, 100:] = 0  # four completions of at most 100 tokens: two length groups
    expected = logps_and_gradients(model, batch, lambda part: masked_pass(model, part, 0.7))

    def taken(speed_ups):
        use_speed_ups(model, speed_ups)
        seen.update(dict.fromkeys(seen, 0))
        values = logps_and_gradients(
            model, batch, lambda part: per_token_logps_and_entropies(model, part, 0.7, chunk_size=chunk_size)[0]
        )
        assert_same_values_and_gradients(values, expected)
        return {
            "mask_free_passes": seen["masked passes"] == 0,
            "passes_by_length": seen["passes"] == 2,
            "cpu_chunked_attention": seen["chunked attention"] > 0,
        }

    assert taken(SpeedUps()) == dict.fromkeys(["mask_free_passes", "passes_by_length", "cpu_chunked_attention"], True)
    without = taken(SpeedUps(**{switched_off: False}))
    still_taken = {name: name != switched_off for name in without}
    if switched_off == "mask_free_passes":
        still_taken["cpu_chunked_attention"] = False  # it runs only where the pass has no mask
    assert without == still_taken
