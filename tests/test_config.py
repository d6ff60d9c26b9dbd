"""Composition: every installed plugin's config is a Hydra group option with typed, checked fields."""

import subprocess
import sys

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import grpo_kit
from grpo_kit.config import DEFAULT_CHOICES, SINGLE_CHOICE_KINDS
from grpo_kit.plugins import PluginError


SET_BY_EMBEDDED_PRESET = {("generation", "num_generations"), ("generation", "max_completion_length")}


def every_option(registry):
    for kind in SINGLE_CHOICE_KINDS:
        for name in registry.names(kind):
            prefix = "+" if kind == "loss" else ""
            yield kind, name, [f"{prefix}{kind}={name}"]
    for name in registry.names("reward"):
        yield "reward", name, [f"+reward={name}"]


def test_every_registered_option_composes(registry):
    options = list(every_option(registry))
    assert len(options) >= 7
    for kind, name, overrides in options:
        cfg = grpo_kit.compose(overrides, registry)
        if kind == "reward":
            assert name in cfg.reward and cfg.reward[name].weight == 1.0
        else:
            assert cfg[kind].name == name
            plugin_config = registry.get(kind, name).config
            for field, default in OmegaConf.to_container(OmegaConf.structured(plugin_config)).items():
                if (kind, field) not in SET_BY_EMBEDDED_PRESET:
                    assert cfg[kind][field] == default, (kind, name, field)


def test_defaults_and_default_loss(registry, caplog):
    with caplog.at_level("INFO"):
        cfg = grpo_kit.compose([], registry)
    assert cfg.loss.name == "dapo"
    assert "No loss given: using dapo" in caplog.text
    for kind, name in DEFAULT_CHOICES.items():
        assert cfg[kind].name == name


def test_plugin_fields_are_options(registry):
    cfg = grpo_kit.compose(["+loss=grpo", "loss.epsilon=0.3", "advantage=group", "generation.temperature=0.7"], registry)
    assert cfg.loss.epsilon == 0.3 and cfg.generation.temperature == 0.7


def test_several_rewards_with_weights(registry):
    cfg = grpo_kit.compose(["+reward=[accuracy]", "reward.accuracy.weight=0.5"], registry)
    assert list(cfg.reward) == ["accuracy"] and cfg.reward.accuracy.weight == 0.5


def test_unknown_plugin_lists_installed_ones(registry):
    with pytest.raises(PluginError, match=r"No loss plugin named 'nope' is installed \(installed: bnpo, cispo, dapo, "):
        grpo_kit.compose(["+loss=nope"], registry)
    with pytest.raises(PluginError, match=r"No advantage plugin named 'grup'"):
        grpo_kit.compose(["advantage=grup"], registry)


def test_misspelled_field_is_rejected_by_name(registry):
    with pytest.raises(ConfigCompositionException, match="epsilonn"):
        grpo_kit.compose(["+loss=dapo", "loss.epsilonn=0.3"], registry)
    with pytest.raises(ConfigCompositionException, match="learning_rat"):
        grpo_kit.compose(["trainer.learning_rat=0.1"], registry)


def test_wrong_type_is_rejected(registry):
    with pytest.raises(ConfigCompositionException, match="epsilon"):
        grpo_kit.compose(["+loss=dapo", "loss.epsilon=wide"], registry)


def test_cli_composes_the_same_config(registry):
    overrides = ["+loss=grpo", "+reward=accuracy", "loss.epsilon=0.25", "seed=3"]
    printed = subprocess.run(
        [sys.executable, "-m", "grpo_kit", *overrides, "--cfg", "job"], capture_output=True, text=True, check=True
    ).stdout
    assert yaml.safe_load(printed) == OmegaConf.to_container(grpo_kit.compose(overrides, registry))


def test_cli_rejects_unknown_plugin_before_building_anything(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpo_kit", "+loss=nope", "+reward=accuracy", f"hydra.run.dir={tmp_path}/run"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "No loss plugin named 'nope' is installed (installed: bnpo, cispo, dapo, dr_grpo, " in result.stderr
    assert not (tmp_path / "run").exists()
