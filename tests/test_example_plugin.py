"""The copy-me example distribution (docs/plugins/example), installed as a user installs it: its plugins are
listed beside the built-ins and its loss trains. Skipped unless it is installed (`pip install docs/plugins/example`,
as CI does)."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_kit
from grpo_kit.testing import tiny_run

pytest.importorskip("grpo_kit_example", reason="the example plugin is not installed: pip install docs/plugins/example")

EXAMPLE = "grpo-kit-example"
ROOT = Path(__file__).parents[1]


def test_grpo_kit_plugins_lists_it_beside_the_built_ins(registry):  # registry: no GRPO_KIT_* variables
    out = subprocess.run(
        [sys.executable, "-m", "grpo_kit.cli.commands", "plugins", "--json"], check=True, capture_output=True, text=True
    ).stdout
    distributions = {(p["kind"], p["name"]): p["distribution"] for p in json.loads(out)}
    assert distributions["loss", "gpg"] == EXAMPLE
    assert distributions["advantage", "gpg"] == EXAMPLE
    assert distributions["reward", "regex_format"] == EXAMPLE
    assert distributions["loss", "dapo"] == "grpo-kit-losses"


def test_its_readme_lists_every_plugin_it_registers(registry):
    readme = (ROOT / "docs/plugins/example/README.md").read_text()
    listed = set(re.findall(r"^\| (\w+) \| `(\w+)` \|", readme, re.MULTILINE))
    registered = {
        (kind, plugin.name)
        for kind in registry.kinds()
        for plugin in registry.plugins(kind)
        if plugin.distribution.split()[0] == EXAMPLE
    }
    assert len(registered) == 5 and listed == registered


def test_its_loss_and_advantage_train_a_tiny_model(registry, tiny_model, tmp_path):
    overrides = tiny_run(tiny_model, "+loss=gpg", "advantage=gpg", "+reward=[accuracy,regex_format]")
    cfg = grpo_kit.compose(overrides, registry)
    grpo_kit.train(cfg, tmp_path, registry)

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert math.isfinite(line["loss"]) and math.isfinite(line["grad_norm"]), line
        assert "gpg/nonzero_advantage_share" in line and "rewards/regex_format/mean" in line
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
