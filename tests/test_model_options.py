"""The options a TRL user brings: data.chat_template_kwargs, model.trust_remote_code,
trainer.gradient_checkpointing_kwargs, model.gradient_checkpointing=auto, and TRL's float32 loading."""

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

import grpo_kit
from grpo_kit.config.schema import ModelConfig
from grpo_kit.model.loading import checkpointing_wanted, load_model
from grpo_kit.rollout.prompts import prompt_text, use_chat_template_kwargs
from grpo_kit.rollout.tool_use import render
from grpo_kit.testing import build_tiny_model, build_tiny_reward_model, tiny_run
from grpo_kit.training.setup import setup

# Qwen3's switch, in the characters the tiny tokenizer knows: "=" with thinking off, "= " otherwise.
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% endfor %}{% if add_generation_prompt %}"
    "{% if enable_thinking is defined and not enable_thinking %}={% else %}= {% endif %}{% endif %}"
)
PROMPT = [{"role": "user", "content": "1+2"}]

REMOTE_CODE = """
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM, Qwen2ForSequenceClassification


class RemoteQwen2ForCausalLM(Qwen2ForCausalLM):
    pass


class RemoteQwen2ForSequenceClassification(Qwen2ForSequenceClassification):
    pass


class RemoteTokenizer(PreTrainedTokenizerFast):
    pass
"""


def with_remote_code(directory, model_class: str):
    """The saved model's folder, its config and tokenizer pointing at classes in its own remote_code.py (as a hub
    repository with custom code does): transformers uses them only with trust_remote_code=True."""
    (directory / "remote_code.py").write_text(REMOTE_CODE)
    for name, entry in (
        ("config.json", {model_class.split(":")[0]: model_class.split(":")[1]}),
        ("tokenizer_config.json", {"AutoTokenizer": [None, "remote_code.RemoteTokenizer"]}),
    ):
        config = json.loads((directory / name).read_text())
        config["auto_map"] = entry
        (directory / name).write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def remote_model(tmp_path_factory):
    directory = build_tiny_model(tmp_path_factory.mktemp("remote"), chat_template=THINKING_TEMPLATE)
    return with_remote_code(directory, "AutoModelForCausalLM:remote_code.RemoteQwen2ForCausalLM")


def test_chat_template_kwargs_reach_every_rendering_of_a_chat_prompt(tiny_model, tmp_path):
    tokenizer = load_model(ModelConfig(name_or_path=str(build_tiny_model(tmp_path, chat_template=THINKING_TEMPLATE))))[
        1
    ]
    assert prompt_text(tokenizer, PROMPT) == "1+2= "
    use_chat_template_kwargs(tokenizer, {"enable_thinking": False})
    assert prompt_text(tokenizer, PROMPT) == "1+2="  # training and eval prompts (grpo_kit/rollout/rollout.py)
    assert tokenizer.decode(render(tokenizer, PROMPT, {}, generation_prompt=True)) == "1+2="  # the tool loop


def test_the_run_applies_its_options_to_the_policy(registry, remote_model, tmp_path):
    overrides = tiny_run(
        remote_model,
        "+reward=accuracy",
        "+data.chat_template_kwargs.enable_thinking=false",
        "model.trust_remote_code=true",
        "model.gradient_checkpointing=true",
        "+trainer.gradient_checkpointing_kwargs.use_reentrant=true",
    )
    session, state = setup(grpo_kit.compose(overrides, registry), tmp_path, registry)
    with session.resources:
        assert prompt_text(session.run.tokenizer, PROMPT) == "1+2="
        assert type(session.run.tokenizer).__name__ == "RemoteTokenizer"
        assert type(state.model).__name__ == "RemoteQwen2ForCausalLM"
        assert state.model.model.layers[0]._gradient_checkpointing_func.keywords == {"use_reentrant": True}


def test_without_trust_remote_code_the_built_in_classes_load(remote_model):
    model, tokenizer = load_model(ModelConfig(name_or_path=str(remote_model)))
    assert type(model) is Qwen2ForCausalLM and type(tokenizer).__name__ != "RemoteTokenizer"


def test_the_reward_model_trusts_remote_code_as_the_policy_does(registry, tmp_path):
    reward_model = with_remote_code(
        build_tiny_reward_model(tmp_path / "reward"),
        "AutoModelForSequenceClassification:remote_code.RemoteQwen2ForSequenceClassification",
    )
    for trust, expected in (
        ("false", "Qwen2ForSequenceClassification"),
        ("true", "RemoteQwen2ForSequenceClassification"),
    ):
        cfg = grpo_kit.compose(
            ["+reward=reward_model", f"reward.reward_model.path={reward_model}", f"model.trust_remote_code={trust}"],
            registry,
        )
        reward = registry.build("reward", "reward_model", grpo_kit.config.compose.options(cfg.reward.reward_model))
        assert type(reward.model).__name__ == expected


def test_gradient_checkpointing_kwargs_choose_reentrancy_and_layers(tiny_model):
    config = ModelConfig(name_or_path=str(tiny_model), gradient_checkpointing=True)
    model, _ = load_model(config, {"use_reentrant": True, "every_n_layers": 2})
    first, second = model.model.layers
    assert first._gradient_checkpointing_func.keywords == {"use_reentrant": True}
    calls = []
    for layer in (first, second):
        layer.mlp.register_forward_hook(lambda module, args, output: calls.append(module))
    model.train()
    model(input_ids=torch.tensor([[3, 4, 5]]), labels=torch.tensor([[3, 4, 5]])).loss.backward()
    assert calls.count(first.mlp) == 2 and calls.count(second.mlp) == 1  # a checkpointed layer runs again backwards


def test_gradient_checkpointing_defaults_to_non_reentrant_as_in_trl(tiny_model):
    model, _ = load_model(ModelConfig(name_or_path=str(tiny_model), gradient_checkpointing=True))
    assert model.model.layers[0]._gradient_checkpointing_func.keywords == {"use_reentrant": False}


def test_auto_gradient_checkpointing_is_on_where_the_model_supports_it(tiny_model, caplog):
    caplog.set_level(logging.INFO)
    model, _ = load_model(ModelConfig(name_or_path=str(tiny_model), gradient_checkpointing="auto"))
    assert model.model.layers[0].gradient_checkpointing
    assert "model.gradient_checkpointing=auto: on" in caplog.text
    unsupported = type("NoCheckpointing", (Qwen2ForCausalLM,), {"supports_gradient_checkpointing": False})
    assert not checkpointing_wanted("auto", unsupported(model.config))
    assert "off, since NoCheckpointing does not support gradient checkpointing" in caplog.text


def test_a_bfloat16_checkpoint_loads_in_float32_as_in_trl(tiny_model, tmp_path):
    AutoModelForCausalLM.from_pretrained(tiny_model).to(torch.bfloat16).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_model / name).read_bytes())
    assert load_model(ModelConfig(name_or_path=str(tmp_path)))[0].dtype == torch.float32
    bfloat16 = ModelConfig(name_or_path=str(tmp_path), model_init_kwargs={"dtype": "bfloat16"})
    assert load_model(bfloat16)[0].dtype == torch.bfloat16


def test_gradient_checkpointing_takes_true_false_or_auto(registry):
    with pytest.raises(
        grpo_kit.contract.errors.ConfigError, match="model.gradient_checkpointing=sometimes must be true, false or auto"
    ):
        grpo_kit.compose(["+reward=accuracy", "model.gradient_checkpointing=sometimes"], registry)


def test_the_speed_up_switches_reach_the_policy_and_its_reference(registry, tiny_model):
    pytest.importorskip("peft")
    from grpo_kit.model.fast.switches import SpeedUps
    from grpo_kit.model.loading import load_reference_model
    from grpo_kit.model.logprobs import speed_ups

    assert speed_ups(load_model(ModelConfig(name_or_path=str(tiny_model)))[0]) == SpeedUps()
    for switches, lora in [
        ("model.mask_free_passes=false", "false"),
        ("model.passes_by_length=false", "true"),
        ("model.cpu_chunked_attention=false", "true"),
    ]:
        cfg = grpo_kit.compose(tiny_run(tiny_model, switches, f"model.lora.enabled={lora}"), registry)
        expected = SpeedUps(**{switches.removeprefix("model.").removesuffix("=false"): False})
        policy, _ = load_model(cfg.model)
        assert speed_ups(policy) == speed_ups(load_reference_model(policy, torch.device("cpu"))) == expected
