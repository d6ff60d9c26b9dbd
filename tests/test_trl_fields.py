"""The TRL field table (grpo_kit/config/trl_fields.py, trl_script_fields.py) against the installed TRL: every
GRPOConfig field has an entry, a refused field's inert value is TRL's default, a mapped key exists in grpo_kit's
config, and docs/trl.md's table is the one the table prints."""

import dataclasses
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import grpo_kit
from grpo_kit.cli.from_trl import markdown_table
from grpo_kit.config.trl_entries import NO_INERT, Mapped, NotApplicable, Refused
from grpo_kit.config.trl_fields import GRPO_CONFIG_FIELDS
from grpo_kit.config.trl_script_fields import SCRIPT

DOC = Path(__file__).parents[1] / "docs" / "trl.md"


def defaults(config_class) -> dict:
    fields = dataclasses.fields(config_class)
    return {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in fields
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }


def test_every_grpo_config_field_has_an_entry(trl):
    installed = {field.name for field in dataclasses.fields(trl.GRPOConfig)}
    assert sorted(installed - set(GRPO_CONFIG_FIELDS)) == [], "new TRL fields: give each an entry in trl_fields.py"
    assert sorted(set(GRPO_CONFIG_FIELDS) - installed) == [], "no longer GRPOConfig fields: move or remove them"


def test_every_script_argument_has_an_entry(trl):
    script = {f.name for config in (trl.ScriptArguments, trl.ModelConfig) for f in dataclasses.fields(config)}
    assert sorted(script - set(SCRIPT)) == []
    assert not set(SCRIPT) & set(GRPO_CONFIG_FIELDS), "a field belongs to one table"


def test_a_refused_fields_inert_value_is_trls_default(trl):
    trl_defaults = defaults(trl.GRPOConfig) | defaults(trl.ScriptArguments) | defaults(trl.ModelConfig)
    checked = 0
    for name, entry in {**GRPO_CONFIG_FIELDS, **SCRIPT}.items():
        if isinstance(entry, Refused) and entry.inert is not NO_INERT and name in trl_defaults:
            assert entry.inert == trl_defaults[name], name
            checked += 1
    assert checked > 40


def test_a_plain_mapping_names_an_existing_option():
    cfg = grpo_kit.compose(["model.name_or_path=x", "data.path=y", "+reward=accuracy"])
    for name, entry in {**GRPO_CONFIG_FIELDS, **SCRIPT}.items():
        if isinstance(entry, Mapped) and entry.translate is None:
            assert OmegaConf.select(cfg, entry.key, default="missing") != "missing", f"{name} -> {entry.key}"


def test_trl_116s_liger_flag_patches_layer_kernels_not_the_loss(trl):
    """What docs/trl.md says of use_liger_kernel, checked in the installed trainer's source: deprecated, and it
    turns Liger's fused cross-entropy off so that TRL's chunked LM head still computes the log-probs."""
    source = inspect.getsource(trl.GRPOTrainer.__init__)
    assert "use_liger_kernel=True` is deprecated" in source
    assert '"fused_linear_cross_entropy": False' in source
    assert "add_fused_lm_head(" in source
    entry = GRPO_CONFIG_FIELDS["use_liger_kernel"]
    assert isinstance(entry, Refused) and "layers" in entry.reason and "model.logits=chunked" in entry.nearest


def test_counts_add_up():
    kinds = [type(entry) for entry in GRPO_CONFIG_FIELDS.values()]
    assert kinds.count(Mapped) + kinds.count(Refused) + kinds.count(NotApplicable) == len(GRPO_CONFIG_FIELDS)


def test_docs_table_is_the_tables():
    text = DOC.read_text()
    start, end = "<!-- trl-fields: grpo-kit from-trl --table -->\n", "\n<!-- /trl-fields -->"
    assert start in text and end in text
    current = text.split(start, 1)[1].split(end, 1)[0]
    assert current.strip() == markdown_table(), (
        "docs/trl.md is stale: paste `grpo-kit from-trl --table` between the markers"
    )


@pytest.mark.parametrize("name", ["use_liger_kernel", "hub_token"])
def test_the_docs_row_says_why(name):
    row = next(line for line in DOC.read_text().splitlines() if line.startswith(f"| `{name}` |"))
    assert "refused" in row and "nearest" in row
