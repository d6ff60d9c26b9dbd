"""model.logits=chunked: log-probs and entropies from the last hidden states, a chunk of positions at a time, with the
plain path's loss, gradients and metrics for any loss, and no (B, T, V) tensor."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.loading import load_reference_model
from grpo_kit.objective.policy_loss import PolicyLoss, build_policy_loss
from grpo_kit.testing import build_tiny_model, tiny_run
from grpo_kit.testing.micro_batches import (
    add_reference_quantities,
    half_a_generation_batch,
    loss_and_gradients,
    random_micro_batch,
)

LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
TOLERANCE = 1e-5


def policy_losses(registry, overrides, chunk_size=5):
    """The plain and the chunked PolicyLoss of the objective `overrides` compose."""
    cfg = grpo_kit.compose(overrides, registry)
    objective = grpo_kit.build_objective(cfg, registry)
    temperature, entropy_grad = cfg.generation.temperature, cfg.algorithm.entropy_coef != 0.0
    full = PolicyLoss(objective, temperature, entropy_grad)
    chunked = PolicyLoss(objective, temperature, entropy_grad, logits="chunked", chunk_size=chunk_size)
    return full, chunked


def assert_same(expected, actual, tolerance=TOLERANCE):
    """(loss, grads, metrics) triples agree: loss and every gradient within `tolerance`, metrics too (NaN = NaN)."""
    (loss, grads, metrics), (other_loss, other_grads, other_metrics) = expected, actual
    assert abs(loss.item() - other_loss.item()) <= tolerance, (loss, other_loss)
    assert grads.keys() == other_grads.keys()
    for name, grad in grads.items():
        difference = (grad - other_grads[name]).abs().max().item()
        assert difference <= tolerance, f"{name}: gradients differ by {difference}"
    assert metrics.keys() == other_metrics.keys()
    for name, value in metrics.items():
        torch.testing.assert_close(other_metrics[name], value, atol=tolerance, rtol=0, equal_nan=True, msg=name)


def load(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir)


SETTINGS = {
    # token-level weights, KL with the bias correction, off-policy old log-probs, a token-level rollout correction
    "token, beta, off-policy, correction": (
        ["algorithm.beta=0.1", "generation.temperature=0.7", "rollout_correction=token_truncate"],
        dict(old=True, ref=True, ratio_level="token"),
    ),
    # sequence-level weights and every entropy feature (which Liger lacks), the off-policy mask, a sequence correction
    "sequence, entropy mask and bonus, off-policy mask": (
        [
            "importance_sampling=sequence",
            "algorithm.top_entropy_quantile=0.5",
            "algorithm.entropy_coef=0.01",
            "algorithm.off_policy_mask_threshold=0.01",
            "algorithm.beta=0.05",
            "algorithm.use_bias_correction_kl=false",
            "rollout_correction=sequence_mask",
        ],
        dict(old=True, ref=True, ratio_level="sequence"),
    ),
}


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("loss", LOSSES)
def test_chunked_loss_gradient_and_metrics_equal_the_plain_ones(registry, tiny_model, loss, setting):
    overrides, quantities = SETTINGS[setting]
    if loss == "vespo" and quantities["ratio_level"] == "sequence":  # vespo takes token-level corrections only
        overrides, quantities = (
            [o for o in overrides if "rollout_correction" not in o],
            quantities | {"ratio_level": None},
        )
    full, chunked = policy_losses(registry, [f"+loss={loss}", *overrides])
    model = load(tiny_model)
    batch = random_micro_batch(model.config.vocab_size)
    with torch.no_grad():
        logps, _ = full.logps(model, batch)
    batch = add_reference_quantities(batch, logps, **quantities)
    expected = loss_and_gradients(full, model, batch)
    assert_same(expected, loss_and_gradients(chunked, model, batch))
    assert chunked.last_path == "chunked"


@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
def test_any_chunk_size_gives_the_plain_values(registry, tiny_model, chunk_size):
    full, chunked = policy_losses(registry, ["+loss=grpo", "algorithm.entropy_coef=0.1"], chunk_size=chunk_size)
    model = load(tiny_model)
    batch = random_micro_batch(model.config.vocab_size, seed=3)
    assert_same(loss_and_gradients(full, model, batch), loss_and_gradients(chunked, model, batch))


def test_old_and_reference_log_probs_equal_the_plain_ones(registry, tiny_model):
    full, chunked = policy_losses(registry, ["+loss=dapo", "algorithm.beta=0.1"])
    model = load(tiny_model)
    reference = load_reference_model(model, torch.device("cpu"))
    batch = random_micro_batch(model.config.vocab_size)
    with torch.no_grad():
        for module in (model, reference):
            for expected, actual in zip(full.logps(module, batch), chunked.logps(module, batch)):
                torch.testing.assert_close(actual, expected, atol=TOLERANCE, rtol=0)


def largest_head_outputs(model, run) -> list[torch.Size]:
    """The shapes of every tensor the LM head outputs while `run()` runs (forward and backward)."""
    shapes = []
    handle = model.get_output_embeddings().register_forward_hook(lambda module, args, out: shapes.append(out.shape))
    try:
        run()
    finally:
        handle.remove()
    return shapes


def test_no_logits_tensor_larger_than_a_chunk_exists(registry, tiny_model):
    full, chunked = policy_losses(registry, ["+loss=dapo", "algorithm.beta=0.1"], chunk_size=5)
    model = load(tiny_model)
    batch = random_micro_batch(model.config.vocab_size, batch_size=4, length=6)
    vocab = model.config.vocab_size

    def train_step(policy_loss):
        with torch.no_grad():
            ref, _ = policy_loss.logps(model, batch)
        referenced = batch.with_references(ref_per_token_logps=ref)
        reduction = half_a_generation_batch(referenced, policy_loss.objective.max_completion_length, 1, 1)
        policy_loss(model, referenced, reduction).loss.backward()

    plain_shapes = largest_head_outputs(model, lambda: train_step(full))
    # (B, T + 1 + the longest prompt padding, V): what the chunked path does without
    assert any(shape[0] == 4 and shape[1] >= 7 and shape[2] == vocab for shape in plain_shapes), plain_shapes
    chunked_shapes = largest_head_outputs(model, lambda: train_step(chunked))
    # The model's own last-position logits (B, 1, V), then chunks of at most 5 positions, recomputed in the backward.
    assert max(shape.numel() for shape in chunked_shapes) <= 5 * vocab, chunked_shapes
    # 24 positions: 4 full chunks for the reference, 4 in the forward pass, 4 recomputed in the backward pass.
    assert chunked_shapes.count(torch.Size([5, vocab])) == 12, chunked_shapes


def test_an_untied_head_and_temperature(registry, tmp_path):
    untied = build_tiny_model(tmp_path / "untied", tie_word_embeddings=False)
    full, chunked = policy_losses(registry, ["+loss=cispo", "generation.temperature=1.3"])
    model = load(untied)
    batch = random_micro_batch(model.config.vocab_size)
    expected = loss_and_gradients(full, model, batch)
    assert "lm_head.weight" in expected[1]
    assert_same(expected, loss_and_gradients(chunked, model, batch))


def test_a_float32_head_under_bf16_autocast(registry, tmp_path):
    from grpo_kit.model.loading import cast_lm_head_to_fp32

    untied = build_tiny_model(tmp_path / "untied", tie_word_embeddings=False)
    full, chunked = policy_losses(registry, ["+loss=grpo"])
    model = load(untied)
    cast_lm_head_to_fp32(model)
    batch = random_micro_batch(model.config.vocab_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = loss_and_gradients(full, model, batch)
        actual = loss_and_gradients(chunked, model, batch)
    assert_same(expected, actual, tolerance=1e-3)


def test_mixed_precision_runs_the_head_as_the_model_does(registry, tiny_model):
    from grpo_kit.model.logprobs import OutputHead, last_hidden_states

    full, chunked = policy_losses(registry, ["+loss=dapo", "algorithm.entropy_coef=0.01"])
    model = load(tiny_model)
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # as accelerate's mixed precision
    batch = random_micro_batch(model.config.vocab_size)
    head = OutputHead(model)
    last_hidden_states(model, batch, head)
    assert head.autocast == ("cpu", torch.bfloat16)
    assert_same(loss_and_gradients(full, model, batch), loss_and_gradients(chunked, model, batch), tolerance=2e-3)


def test_soft_capped_logits(registry, soft_capped_model):
    full, chunked = policy_losses(registry, ["+loss=dapo"])
    batch = random_micro_batch(soft_capped_model.config.vocab_size)
    model = soft_capped_model
    assert_same(loss_and_gradients(full, model, batch), loss_and_gradients(chunked, model, batch))


def test_a_model_whose_logits_are_not_its_heads_output_is_refused(registry, tiny_model):
    _, chunked = policy_losses(registry, ["+loss=dapo"])
    model = load(tiny_model)
    model.config.final_logit_softcapping = 0.01  # Qwen2 does not soft-cap, so the chunked head would differ
    batch = random_micro_batch(model.config.vocab_size)
    with pytest.raises(ValueError, match="model.logits=full"):
        chunked(model, batch, half_a_generation_batch(batch, chunked.objective.max_completion_length, 1, 1))


def test_a_lora_policy_and_its_adapter_free_reference(registry, tiny_model):
    pytest.importorskip("peft")
    from grpo_kit.config.schema import LoraConfig
    from grpo_kit.model.lora import add_adapters

    full, chunked = policy_losses(registry, ["+loss=bnpo", "algorithm.beta=0.1"])
    model = add_adapters(load(tiny_model), LoraConfig(dropout=0.0))
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():  # B = 0 at initialisation would hide the adapters
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)
    reference = load_reference_model(model, torch.device("cpu"))
    batch = random_micro_batch(model.config.vocab_size)
    with torch.no_grad():
        ref_logps, _ = full.logps(reference, batch)
        torch.testing.assert_close(chunked.logps(reference, batch)[0], ref_logps, atol=TOLERANCE, rtol=0)
        assert (ref_logps - full.logps(model, batch)[0]).abs().max() > 1e-3  # the adapters were really off
    batch = batch.with_references(ref_per_token_logps=ref_logps)
    expected = loss_and_gradients(full, model, batch)
    assert expected[1] and all("lora" in name for name in expected[1])
    assert_same(expected, loss_and_gradients(chunked, model, batch))


def test_a_plugin_loss_the_core_does_not_know(registry, local_plugin, tiny_model):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    module = local_plugin(
        "square_loss",
        """
        import grpo_kit
        from grpo_kit.contract.reductions import local_token_mean

        class SquareLoss:
            importance_sampling_level = None
            importance_sampling_advice = ""
            rollout_correction_levels = None
            consumes_rollout_ratio = False

            def __init__(self, config):
                pass

            def per_token_loss(self, inputs):
                return -inputs.advantages * inputs.per_token_logps - 0.1 * inputs.per_token_logps ** 2, {}

            def reduce(self, per_token_loss, mask, reduction):
                return local_token_mean(per_token_loss, mask, reduction)

        @grpo_kit.hookimpl
        def register_losses(register):
            register("square", SquareLoss)
    """,
    )
    with_square = Registry(plugin_manager(local_modules=[module]))
    full, chunked = policy_losses(with_square, ["+loss=square", "algorithm.entropy_coef=0.05"])
    model = load(tiny_model)
    batch = random_micro_batch(model.config.vocab_size)
    assert_same(loss_and_gradients(full, model, batch), loss_and_gradients(chunked, model, batch))


def test_the_options_compose_and_a_wrong_one_is_refused(registry, tiny_model):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "model.logits=chunked", "model.logits_chunk_size=64"), registry)
    policy_loss = build_policy_loss(cfg, grpo_kit.build_objective(cfg, registry))
    assert (policy_loss.logits, policy_loss.chunk_size) == ("chunked", 64)
    for wrong in ("model.logits=fused", "model.logits_chunk_size=0"):
        cfg = grpo_kit.compose(tiny_run(tiny_model, wrong), registry)
        with pytest.raises(ConfigError, match=wrong.split("=")[0]):
            build_policy_loss(cfg, grpo_kit.build_objective(cfg, registry))


def test_a_run_with_chunked_logits_trains_the_plain_runs_weights(digits_registry, tiny_model, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import grpo_kit.objective.policy_loss

    calls = []
    chunked = grpo_kit.objective.policy_loss.chunked_logps_and_entropies
    monkeypatch.setattr(
        grpo_kit.objective.policy_loss,
        "chunked_logps_and_entropies",
        lambda *a, **k: calls.append(1) or chunked(*a, **k),
    )
    for name, extra in [("full", []), ("chunked", ["model.logits=chunked", "model.logits_chunk_size=16"])]:
        overrides = tiny_run(tiny_model, "+reward=digits", "algorithm.beta=0.1", "algorithm.num_iterations=2", *extra)
        grpo_kit.train(grpo_kit.compose(overrides, digits_registry), tmp_path / name, digits_registry)
    assert calls, (
        "the trainer does not build its PolicyLoss with grpo_kit.objective.policy_loss.build_policy_loss(cfg, "
        "objective)"
    )
    plain = load_file(tmp_path / "full" / "model" / "model.safetensors")
    trained = load_file(tmp_path / "chunked" / "model" / "model.safetensors")
    for name in plain:
        torch.testing.assert_close(trained[name], plain[name], atol=1e-5, rtol=1e-4)
