"""Real-model settings: LoRA (and its merged copy for generation), checkpointing, mixed precision, head precision,
dropout, and from_pretrained keyword arguments, each on a tiny model trained for a few steps."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.config.schema import LoraConfig, ModelConfig
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.loading import load_model
from grpo_kit.testing import build_tiny_model, tiny_run


@pytest.fixture
def registry(digits_registry):
    return digits_registry  # a reward the untrained tiny model earns, so that every step has a gradient


def run(model, *extra):
    return tiny_run(model, "+reward=digits", *extra)


def logged(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir):
    return load_file(run_dir / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def untied_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("untied"), tie_word_embeddings=False)


# LoRA


def test_lora_trains_the_adapters_only_and_saves_them(registry, tiny_model, tmp_path):
    pytest.importorskip("peft")
    grpo_kit.train(
        grpo_kit.compose(run(tiny_model, "model.lora.enabled=true", "model.lora.r=4"), registry),
        tmp_path / "run",
        registry,
    )
    saved = tmp_path / "run" / "model"
    assert (saved / "adapter_config.json").exists() and not (saved / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    adapted = AutoModelForCausalLM.from_pretrained(saved)  # transformers finds the base model through PEFT
    assert any("lora_B" in name and value.abs().sum() > 0 for name, value in adapted.state_dict().items())
    # The adapters start at zero (B = 0) and moved; the base weights under them did not.
    for name, value in adapted.state_dict().items():
        plain = name.replace(".base_layer", "")
        if "lora_" not in name:
            assert torch.equal(value, base[plain]), name


def test_a_lora_run_resumes_from_its_checkpoint(registry, tiny_model, tmp_path):
    pytest.importorskip("peft")
    # A constant learning rate: the shorter first leg must not change the schedule.
    overrides = run(
        tiny_model,
        "model.lora.enabled=true",
        "trainer.save_steps=1",
        "trainer.lr_scheduler_type=constant",
        "trainer.max_steps=3",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "whole", registry)
    grpo_kit.train(grpo_kit.compose([*overrides[:-1], "trainer.max_steps=2"], registry), tmp_path / "part", registry)
    resumed = grpo_kit.compose([*overrides, "trainer.resume=auto", "trainer.resume_force=true"], registry)
    grpo_kit.train(resumed, tmp_path / "part", registry)
    whole = load_file(tmp_path / "whole" / "model" / "adapter_model.safetensors")
    part = load_file(tmp_path / "part" / "model" / "adapter_model.safetensors")
    assert all(torch.equal(whole[name], part[name]) for name in whole)


def test_the_reference_of_a_lora_run_is_its_base_model(registry, tiny_model, tmp_path):
    pytest.importorskip("peft")
    overrides = run(tiny_model, "model.lora.enabled=true", "algorithm.beta=0.1", "trainer.max_steps=3")
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    kl = [line["kl"] for line in logged(tmp_path / "run")]
    assert kl[0] == 0.0  # before the first update the adapters add nothing: policy and base are one model
    assert kl[-1] > 0.0


def test_generating_from_a_merged_copy_samples_the_trained_lora_policy(registry, tiny_model, tmp_path):
    pytest.importorskip("peft")
    from grpo_kit.contract.lora import merged_copy, refresh_merged_copy
    from grpo_kit.model.lora import add_adapters

    model = add_adapters(AutoModelForCausalLM.from_pretrained(tiny_model), LoraConfig(r=4, dropout=0.0)).eval()
    merged = merged_copy(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.add_(torch.randn_like(parameter))  # a "trained" adapter
    refresh_merged_copy(model, merged)
    inputs = torch.randint(2, 16, (3, 7))
    assert not hasattr(merged, "peft_config")
    torch.testing.assert_close(merged(input_ids=inputs).logits, model(input_ids=inputs).logits, atol=1e-5, rtol=1e-5)

    overrides = run(tiny_model, "model.lora.enabled=true", "generation.merge_lora=true", "algorithm.beta=0.1")
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    assert len(logged(tmp_path / "run")) == 3


def test_merge_lora_without_lora_says_what_to_turn_on(registry, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="model.lora.enabled=true"):
        grpo_kit.train(
            grpo_kit.compose(run(tiny_model, "generation.merge_lora=true"), registry), tmp_path / "run", registry
        )


def test_a_lora_reference_cannot_be_synced(registry, tiny_model):
    with pytest.raises(ConfigError, match="sync_ref_model"):
        grpo_kit.compose(
            run(tiny_model, "model.lora.enabled=true", "algorithm.beta=0.1", "algorithm.sync_ref_model=true"), registry
        )


# Memory and precision


def test_gradient_checkpointing_trains_the_same_weights(registry, tiny_model, tmp_path):
    for name, extra in [("plain", []), ("checkpointed", ["model.gradient_checkpointing=true"])]:
        grpo_kit.train(grpo_kit.compose(run(tiny_model, *extra), registry), tmp_path / name, registry)
    plain, checkpointed = final_weights(tmp_path / "plain"), final_weights(tmp_path / "checkpointed")
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(registry, tiny_model, tmp_path, precision):
    grpo_kit.train(
        grpo_kit.compose(run(tiny_model, f"trainer.mixed_precision={precision}"), registry), tmp_path / "run", registry
    )
    lines = logged(tmp_path / "run")
    assert all(torch.isfinite(torch.tensor(line["loss"])) for line in lines)
    weights = final_weights(tmp_path / "run")
    start = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert all(value.dtype == torch.float32 for value in weights.values())  # autocast: the weights stay float32
    assert any(not torch.equal(weights[name], start[name]) for name in weights)


def test_an_unknown_precision_is_refused(registry, tiny_model):
    with pytest.raises(ConfigError, match="no, bf16, fp16"):
        grpo_kit.compose(run(tiny_model, "trainer.mixed_precision=fp8"), registry)


def test_the_lm_head_computes_in_float32_under_bf16(registry, untied_model, tmp_path):
    model, _ = load_model(
        ModelConfig(
            name_or_path=str(untied_model), cast_lm_head_to_fp32=True, model_init_kwargs={"dtype": torch.bfloat16}
        )
    )
    assert model.lm_head.weight.dtype == torch.float32
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=torch.randint(2, 16, (2, 5))).logits.dtype == torch.float32
    overrides = run(untied_model, "model.cast_lm_head_to_fp32=true", "trainer.mixed_precision=bf16")
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path / "run", registry)
    assert len(logged(tmp_path / "run")) == 3


def test_a_tied_lm_head_cannot_be_cast(tiny_model):
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        load_model(ModelConfig(name_or_path=str(tiny_model), cast_lm_head_to_fp32=True))


@pytest.mark.parametrize("lora", [False, True])
def test_disable_dropout_makes_training_forward_passes_repeatable(tmp_path, lora):
    if lora:
        pytest.importorskip("peft")
    path = build_tiny_model(tmp_path / "model", attention_dropout=0.5)
    inputs = torch.randint(2, 16, (2, 6))
    for disabled in (False, True):
        config = ModelConfig(
            name_or_path=str(path), disable_dropout=disabled, lora=LoraConfig(enabled=lora, dropout=0.5)
        )
        model = load_model(config)[0].train()
        repeatable = torch.equal(model(input_ids=inputs).logits, model(input_ids=inputs).logits)
        assert repeatable == disabled


def test_model_init_kwargs_reach_from_pretrained(tiny_model):
    model, _ = load_model(ModelConfig(name_or_path=str(tiny_model), model_init_kwargs={"dtype": torch.bfloat16}))
    assert next(model.parameters()).dtype == torch.bfloat16


def test_lora_without_peft_says_how_to_install_it(monkeypatch, tiny_model):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real_find_spec(name, *a)
    )
    with pytest.raises(ModuleNotFoundError, match=r"grpo-kit\[lora\]"):
        load_model(ModelConfig(name_or_path=str(tiny_model), lora=LoraConfig(enabled=True)))
