"""model.pad_to_multiple_of and model.passes_by_length=auto: training passes of few distinct shapes on a GPU, with the
values of unrounded passes (tested on the CPU, with the multiple asked for explicitly)."""

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.config.schema import ModelConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.fast.stable_widths import width_multiple
from grpo_kit.model.fast.switches import SpeedUps, takes_length_groups, use_speed_ups
from grpo_kit.model.loading import load_model
from grpo_kit.model.logprobs import speed_ups
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.testing import tiny_run
from grpo_kit.testing.dispatch import forward_input_shapes
from grpo_kit.testing.micro_batches import add_reference_quantities, loss_and_gradients, random_micro_batch

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_rounds_to_64_and_leaves_length_groups_off_on_a_cuda_gpu_only():
    assert width_multiple("auto", CUDA) == 64 and width_multiple("auto", CPU) is None
    assert width_multiple(16, CPU) == 16 and width_multiple(None, CUDA) is None
    assert not takes_length_groups(SpeedUps(), CUDA) and takes_length_groups(SpeedUps(), CPU)
    assert takes_length_groups(SpeedUps(passes_by_length=True), CUDA)
    assert not takes_length_groups(SpeedUps(passes_by_length=False), CPU)


@pytest.mark.parametrize("logits", ["full", "chunked", "tiled"])
def test_rounded_passes_give_the_unrounded_loss_and_gradients(registry, tiny_model, logits):
    cfg = grpo_kit.compose(["+loss=dapo", "algorithm.beta=0.1", "algorithm.entropy_coef=0.01"], registry)
    objective = grpo_kit.build_objective(cfg, registry)
    policy_loss = PolicyLoss(objective, 0.8, True, logits=logits, chunk_size=7, vocab_tile=5)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    batch = random_micro_batch(model.config.vocab_size, batch_size=6, prompt_length=5, length=19)
    with torch.no_grad():
        logps, _ = policy_loss.logps(model, batch)
    batch = add_reference_quantities(batch, logps, old=True, ref=True)
    expected = loss_and_gradients(policy_loss, model, batch)

    use_speed_ups(model, SpeedUps(pad_to_multiple_of=16, passes_by_length=False))
    with forward_input_shapes(model) as calls:
        actual = loss_and_gradients(policy_loss, model, batch)
    widths = {dict(call)["input_ids"][1] for call in calls}
    assert widths == {32}, widths  # 5 prompt + 19 completion columns, rounded up
    torch.testing.assert_close(actual[0], expected[0], atol=1e-5, rtol=0)
    for name, grad in expected[1].items():
        torch.testing.assert_close(actual[1][name], grad, atol=1e-5, rtol=0, msg=name)


def test_micro_batches_of_different_lengths_share_one_width(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.config.max_position_embeddings = 256
    use_speed_ups(model, SpeedUps(pad_to_multiple_of=64))
    policy_loss = PolicyLoss(grpo_kit.build_objective(grpo_kit.compose(["+loss=dapo"])), 1.0, False)
    with forward_input_shapes(model) as calls, torch.no_grad():
        for length in (3, 17, 40, 58):
            policy_loss.logps(model, random_micro_batch(model.config.vocab_size, prompt_length=4, length=length))
    assert {dict(call)["input_ids"][1] for call in calls} == {64}
    unrounded = dataclasses.replace(SpeedUps(), pad_to_multiple_of=None)
    use_speed_ups(model, unrounded)
    with forward_input_shapes(model) as calls, torch.no_grad():
        for length in (3, 17, 40, 58):
            policy_loss.logps(model, random_micro_batch(model.config.vocab_size, prompt_length=4, length=length))
    assert len({dict(call)["input_ids"][1] for call in calls}) >= 4  # what the rounding saves


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.pad_to_multiple_of=0", "model.pad_to_multiple_of=0 must be auto"),
        ("model.pad_to_multiple_of=often", "model.pad_to_multiple_of='often' must be auto"),
        ("model.passes_by_length=sometimes", "model.passes_by_length='sometimes' must be true, false or auto"),
    ],
)
def test_a_wrong_setting_is_refused_before_the_weights_load(registry, tiny_model, override, message):
    cfg = grpo_kit.compose(tiny_run(tiny_model, override), registry)
    with pytest.raises(ConfigError, match=message):
        load_model(cfg.model)


def test_the_settings_reach_the_model(tiny_model):
    model, _ = load_model(ModelConfig(name_or_path=str(tiny_model), pad_to_multiple_of=32, passes_by_length=True))
    assert speed_ups(model) == SpeedUps(passes_by_length=True, pad_to_multiple_of=32)
