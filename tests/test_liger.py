"""model.logits=liger: liger-kernel's fused linear GRPO loss where it computes the plugin's loss (equal loss, gradients
and metrics to the plain path), and the chunked path, with the reason logged once, where it does not.

liger-kernel is optional (the `liger` extra); these tests skip without it, except the one for its absence.
"""

import importlib.util
import json
import logging
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.testing import build_tiny_model, tiny_run
from grpo_kit.testing.micro_batches import (
    add_reference_quantities,
    half_a_generation_batch,
    loss_and_gradients,
    random_micro_batch,
)


@pytest.fixture
def liger():
    """Skips without liger-kernel, or fails where GRPO_KIT_REQUIRE_LIGER=1 (CI sets it), so that a broken install
    cannot pass CI by skipping."""
    if importlib.util.find_spec("liger_kernel") is None:
        reason = "liger-kernel is not installed (the liger extra): pip install -e '.[liger]'"
        if os.environ.get("GRPO_KIT_REQUIRE_LIGER") == "1":
            pytest.fail(f"GRPO_KIT_REQUIRE_LIGER=1, but {reason}", pytrace=False)
        pytest.skip(reason)


needs_liger = pytest.mark.usefixtures("liger")
TOLERANCE = 1e-5
LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
# Options that put each loss's own parameters to work (clipping on both sides, delta, the gates' temperatures).
LOSS_OPTIONS = {
    "grpo": ["loss.epsilon_high=0.28", "loss.delta=1.5"],
    "bnpo": ["loss.epsilon=0.1"],
    "dr_grpo": ["loss.epsilon_high=0.3"],
    "dapo": ["loss.epsilon_high=0.28", "loss.delta=1.4"],
    "cispo": ["loss.epsilon_high=1.1"],
    "sapo": ["loss.temperature_pos=0.8", "loss.temperature_neg=1.2"],
    "luspo": ["loss.epsilon=0.15"],
    "vespo": ["loss.k_pos=1.5", "loss.lambda_neg=2.5"],
}
SETTINGS = {
    "token, beta, bias-corrected KL, off-policy, token correction": (
        ["algorithm.beta=0.1", "generation.temperature=0.7", "rollout_correction=token_truncate"],
        dict(old=True, ref=True, ratio_level="token"),
    ),
    "token, plain KL, off-policy, no correction": (
        ["algorithm.beta=0.04", "algorithm.use_bias_correction_kl=false"],
        dict(old=True, ref=True),
    ),
    "sequence, on-policy, sequence correction": (
        ["importance_sampling=sequence", "rollout_correction=sequence_truncate"],
        dict(ratio_level="sequence"),
    ),
}
# Where Liger's loss is not the plugin's, and the chunked path computes it instead:
# luspo's loss weights every position by its sequence's length, padding included, once the per-token loss is
# (B, T) (token-level weights, or the KL term); Liger refuses sequence-level weights for cispo, sapo and vespo.
CHUNKED = {
    ("luspo", "token, beta, bias-corrected KL, off-policy, token correction"),
    ("luspo", "token, plain KL, off-policy, no correction"),
    ("cispo", "sequence, on-policy, sequence correction"),
    ("sapo", "sequence, on-policy, sequence correction"),
    ("vespo", "sequence, on-policy, sequence correction"),
}


def liger_and_plain(registry, overrides, chunk_size=5, **policy_loss_options):
    cfg = grpo_kit.compose(overrides, registry)
    objective = grpo_kit.build_objective(cfg, registry)
    temperature, entropy_grad = cfg.generation.temperature, cfg.algorithm.entropy_coef != 0.0
    liger = PolicyLoss(
        objective, temperature, entropy_grad, logits="liger", chunk_size=chunk_size, **policy_loss_options
    )
    return liger, PolicyLoss(objective, temperature, entropy_grad)


def assert_same(expected, actual, tolerance=TOLERANCE):
    (loss, grads, metrics), (other_loss, other_grads, other_metrics) = expected, actual
    assert abs(loss.item() - other_loss.item()) <= tolerance, (loss, other_loss)
    assert grads.keys() == other_grads.keys()
    for name, grad in grads.items():
        difference = (grad - other_grads[name]).abs().max().item()
        assert difference <= tolerance, f"{name}: gradients differ by {difference}"
    assert metrics.keys() == other_metrics.keys()
    for name, value in metrics.items():
        torch.testing.assert_close(other_metrics[name], value, atol=tolerance, rtol=0, equal_nan=True, msg=name)


def compare(liger, plain, model, quantities=None, seed=0, **divisors):
    """`divisors`: the Reduction's accumulation and process counts, where they are not half_a_generation_batch's."""
    batch = random_micro_batch(model.config.vocab_size, seed=seed)
    if quantities:
        with torch.no_grad():
            logps, _ = plain.logps(model, batch)
        batch = add_reference_quantities(batch, logps, **quantities)
    reduction = half_a_generation_batch(batch, plain.objective.max_completion_length, **divisors)
    expected = loss_and_gradients(plain, model, batch, reduction)
    assert_same(expected, loss_and_gradients(liger, model, batch, reduction))


@needs_liger
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("loss", LOSSES)
def test_liger_computes_each_loss_it_covers_as_the_plain_path(registry, tiny_model, loss, setting):
    overrides, quantities = SETTINGS[setting]
    if loss == "vespo" and quantities.get("ratio_level") == "sequence":  # vespo takes token-level corrections only
        overrides, quantities = [o for o in overrides if "rollout_correction" not in o], {}
    liger, plain = liger_and_plain(registry, [f"+loss={loss}", *LOSS_OPTIONS[loss], *overrides])
    compare(liger, plain, AutoModelForCausalLM.from_pretrained(tiny_model), quantities)
    assert liger.last_path == ("chunked" if (loss, setting) in CHUNKED else "liger")


@needs_liger
@pytest.mark.parametrize("loss", ["dapo", "grpo"])
def test_liger_divides_as_the_plugin_does_under_accumulation(registry, tiny_model, loss):
    liger, plain = liger_and_plain(registry, [f"+loss={loss}", "algorithm.beta=0.1"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    for divisors in ({"gradient_accumulation_steps": 4, "steps_per_generation": 8}, {"num_processes": 2}):
        compare(liger, plain, model, dict(old=True, ref=True), **divisors)
        assert liger.last_path == "liger"


@needs_liger
@pytest.mark.parametrize(
    "option, reason",
    [
        ("algorithm.entropy_coef=0.01", "entropy_coef"),
        ("algorithm.top_entropy_quantile=0.5", "top_entropy_quantile"),
        ("algorithm.off_policy_mask_threshold=0.01", "off_policy_mask_threshold"),
    ],
)
def test_what_liger_lacks_falls_back_to_the_chunked_path_and_says_why_once(
    registry, tiny_model, caplog, option, reason
):
    with caplog.at_level(logging.WARNING, logger="grpo_kit.objective.policy_loss"):
        liger, plain = liger_and_plain(registry, ["+loss=dapo", "algorithm.beta=0.1", option])
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        for seed in (0, 1):
            compare(liger, plain, model, dict(old=True, ref=True), seed=seed)
    assert liger.last_path == "chunked"
    assert [record.message for record in caplog.records if reason in record.message] == [
        next(record.message for record in caplog.records if reason in record.message)
    ]


@needs_liger
def test_a_plugin_loss_without_a_liger_equivalent_gets_the_chunked_path(plain_loss_registry, tiny_model, caplog):
    with caplog.at_level(logging.WARNING, logger="grpo_kit.objective.policy_loss"):
        liger, plain = liger_and_plain(plain_loss_registry, ["+loss=plain_pg"])
    assert "declares no Liger equivalent" in caplog.text
    compare(liger, plain, AutoModelForCausalLM.from_pretrained(tiny_model))
    assert liger.last_path == "chunked"


@needs_liger
@pytest.mark.parametrize(
    "module_name, declared, reason",
    [
        ("mislabelled_loss", "{'epsilon_low': 0.2}", "gives another loss"),
        ("misspelled_loss", "{'epsilon_lo': 0.2}", "refused the 'dapo' loss's options"),
    ],
)
def test_a_wrong_declaration_is_caught_before_it_trains(
    local_plugin, tiny_model, caplog, module_name, declared, reason
):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    module = local_plugin(
        module_name,
        f"""
        import grpo_kit
        from grpo_kit.contract.kinds import LigerLoss
        from grpo_kit.contract.reductions import global_token_mean

        class Unclipped:  # dapo's reduction of the unclipped surrogate, declared as Liger's (clipped) dapo
            importance_sampling_level = None
            importance_sampling_advice = ""
            rollout_correction_levels = None
            consumes_rollout_ratio = False

            def __init__(self, config):
                pass

            def per_token_loss(self, inputs):
                import torch
                return -torch.exp(inputs.log_weights) * inputs.advantages, {{}}

            def reduce(self, per_token_loss, mask, reduction):
                return global_token_mean(per_token_loss, mask, reduction)

            def liger_loss(self):
                return LigerLoss("dapo", {declared}, per_micro_batch=False)

        @grpo_kit.hookimpl
        def register_losses(register):
            register("unclipped", Unclipped)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module]))
    with caplog.at_level(logging.WARNING, logger="grpo_kit.objective.policy_loss"):
        liger, plain = liger_and_plain(registry, ["+loss=unclipped"])
        compare(liger, plain, AutoModelForCausalLM.from_pretrained(tiny_model), dict(old=True))
    assert liger.last_path == "chunked" and reason in caplog.text


@needs_liger
def test_an_untied_head_and_a_float32_head(registry, tmp_path):
    from grpo_kit.model.loading import cast_lm_head_to_fp32

    untied = build_tiny_model(tmp_path / "untied", tie_word_embeddings=False)
    liger, plain = liger_and_plain(registry, ["+loss=grpo", "algorithm.beta=0.1"])
    model = AutoModelForCausalLM.from_pretrained(untied)
    compare(liger, plain, model, dict(old=True, ref=True))
    assert liger.last_path == "liger"
    cast_lm_head_to_fp32(model)  # a replaced forward: Liger only with head_in_float32 (model.cast_lm_head_to_fp32)
    liger, plain = liger_and_plain(registry, ["+loss=grpo"])
    compare(liger, plain, model)
    assert liger.last_path == "chunked"
    liger, plain = liger_and_plain(registry, ["+loss=grpo"], head_in_float32=True)
    compare(liger, plain, model)
    assert liger.last_path == "liger"


@needs_liger
def test_a_lora_policy(registry, tiny_model):
    pytest.importorskip("peft")
    from grpo_kit.config.schema import LoraConfig
    from grpo_kit.model.lora import add_adapters

    model = add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(dropout=0.0))
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.1)
    liger, plain = liger_and_plain(registry, ["+loss=dapo", "algorithm.beta=0.1"])
    compare(liger, plain, model, dict(old=True, ref=True))
    assert liger.last_path == "liger"


@needs_liger
def test_mixed_precision_runs_the_head_as_the_model_does(registry, tiny_model):
    liger, plain = liger_and_plain(registry, ["+loss=dapo", "algorithm.beta=0.1"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    model.forward = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)  # as accelerate's mixed precision
    batch = random_micro_batch(model.config.vocab_size)
    with torch.no_grad():
        batch = add_reference_quantities(batch, plain.logps(model, batch)[0], old=True, ref=True)
    expected = loss_and_gradients(plain, model, batch)
    assert_same(expected, loss_and_gradients(liger, model, batch), tolerance=2e-3)
    assert liger.last_path == "liger"


@needs_liger
def test_soft_capped_logits_get_the_chunked_path(registry, caplog, soft_capped_model):
    liger, plain = liger_and_plain(registry, ["+loss=dapo"])
    with caplog.at_level(logging.WARNING, logger="grpo_kit.objective.policy_loss"):
        compare(liger, plain, soft_capped_model)
    assert liger.last_path == "chunked" and "final_logit_softcapping" in caplog.text


def test_without_liger_kernel_the_option_says_how_to_install_it(registry, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real_find_spec(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=r"grpo-kit\[liger\]"):
        liger_and_plain(registry, ["+loss=dapo"])


@needs_liger
def test_a_run_with_liger_takes_the_plain_runs_first_step(digits_registry, tiny_model, tmp_path, monkeypatch):
    from grpo_kit.objective.liger import FusedGRPOLoss

    calls = []
    fused = FusedGRPOLoss.__call__
    monkeypatch.setattr(FusedGRPOLoss, "__call__", lambda *a, **k: calls.append(1) or fused(*a, **k))
    first_steps = {}
    for name, extra in [("full", []), ("liger", ["model.logits=liger"])]:
        overrides = tiny_run(tiny_model, "+reward=digits", "+loss=grpo", "algorithm.beta=0.1", *extra)
        grpo_kit.train(grpo_kit.compose(overrides, digits_registry), tmp_path / name, digits_registry)
        first_steps[name] = json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])
    assert calls, (
        "the trainer does not build its PolicyLoss with grpo_kit.objective.policy_loss.build_policy_loss(cfg, "
        "objective)"
    )
    # One step's numbers agree; later ones stray by Adam's amplification of ~1e-8 differences in tiny gradients.
    for key in ("loss", "grad_norm", "kl", "entropy", "clip_ratio/region_mean"):
        assert first_steps["liger"][key] == pytest.approx(first_steps["full"][key], abs=TOLERANCE), key


@needs_liger
def test_the_check_against_the_plain_objective_draws_only_from_its_own_seeded_generator(registry):
    # Its seeded CPU generator makes the check the same on every device (a CUDA tensor refuses a CPU generator, which
    # broke it on the GPU); drawing from the global stream would shift a run's sampling once Liger checks a setting.
    liger, _ = liger_and_plain(registry, ["+loss=dapo"])
    batch = random_micro_batch(vocab_size=32)
    reduction = half_a_generation_batch(batch, liger.objective.max_completion_length)
    global_stream = torch.random.get_rng_state()
    assert liger.fused.batch_reason(batch, reduction) is None
    assert torch.equal(torch.random.get_rng_state(), global_stream), "the check drew from torch's global generator"
