"""`grpo-kit plugins`: every installed plugin with its distribution and its options, as a table or as JSON."""

import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

from grpo_kit.cli.commands import COMMANDS, build_parser, hydra_value, main

ROOT = Path(__file__).parents[1]


@pytest.fixture
def clean_environment(monkeypatch):
    for variable in ("GRPO_KIT_PLUGINS", "GRPO_KIT_DISABLE_PLUGINS", "GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(variable, raising=False)


def listed(capsys, *args) -> list[dict]:
    assert main(["plugins", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_lists_the_built_ins_with_distribution_version_and_options(clean_environment, capsys):
    plugins = {(p["kind"], p["name"]): p for p in listed(capsys)}
    dapo = plugins["loss", "dapo"]
    assert (dapo["distribution"], dapo["version"]) == ("grpo-kit-losses", "0.1.0")
    assert dapo["implementation"] == "grpo_kit_losses.dapo:DAPO"
    epsilon = next(option for option in dapo["options"] if option["name"] == "epsilon")
    assert epsilon == {
        "name": "epsilon",
        "type": "float",
        "default": 0.2,
        "help": "lower clip: the ratio is kept above 1 - epsilon where the advantage is negative",
    }
    assert {"importance_sampling", "rollout_correction", "advantage", "reward", "generation"} <= {
        kind for kind, _ in plugins
    }
    assert plugins["importance_sampling", "token"]["options"] == []  # registered without a config


def test_kind_filter(clean_environment, capsys):
    assert {p["kind"] for p in listed(capsys, "--kind", "advantage")} == {"advantage"}


def test_table_writes_each_option_as_the_override_that_sets_it(clean_environment, capsys):
    assert main(["plugins", "--kind", "loss", "--kind", "reward"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "DESCRIPTION"]
    assert any(line.split()[:4] == ["loss", "dapo", "grpo-kit-losses", "0.1.0"] for line in lines)
    (epsilon_high,) = [line for line in lines if line.strip().startswith("loss.epsilon_high=null")][:1]
    assert "float | None" in epsilon_high and "upper clip; None uses epsilon" in epsilon_high
    assert "reward.accuracy.solution_column=solution" in out  # rewards are set under reward.NAME.


def test_a_local_module_with_every_way_of_giving_help(clean_environment, local_plugin, monkeypatch, capsys):
    module = local_plugin(
        "documented_reward",
        """
        from dataclasses import dataclass, field

        import grpo_kit


        @dataclass
        class Options(grpo_kit.RewardConfig):
            target: int = 2  # characters
            # The unit the target counts,
            # "chars" or "words".
            unit: str = "chars"
            tags: list = field(default_factory=lambda: ["a b"], metadata={"help": "from metadata"})
            required: str = field(default=None)
            scale: float = field(  # spread over
                default=1.5,  # two lines
            )


        def brevity(prompts, completions, completion_ids, **options):
            return [0.0] * len(completions)


        @grpo_kit.hookimpl
        def register_rewards(register):
            register("brevity", brevity, Options)
    """,
    )
    monkeypatch.setenv("GRPO_KIT_PLUGINS", module)
    (brevity,) = [p for p in listed(capsys, "--kind", "reward") if p["name"] == "brevity"]
    assert (brevity["distribution"], brevity["version"]) == ("local module documented_reward", None)
    options = {option["name"]: option for option in brevity["options"]}
    assert list(options) == ["weight", "target", "unit", "tags", "required", "scale"]  # the base's fields first
    assert options["target"]["help"] == "characters"
    assert options["unit"]["help"] == 'The unit the target counts, "chars" or "words".'
    assert options["tags"] == {"name": "tags", "type": "list", "default": ["a b"], "help": "from metadata"}
    assert options["scale"]["help"] == "spread over two lines"
    assert options["required"]["default"] is None

    assert main(["plugins", "--kind", "reward"]) == 0
    assert 'reward.brevity.tags=["a b"]' in capsys.readouterr().out


def test_hydra_values():
    assert [hydra_value(v) for v in (None, True, 0.2, "dapo", "${generation.max_completion_length}", "a b", "???")] == [
        "null",
        "true",
        "0.2",
        "dapo",
        "${generation.max_completion_length}",
        '"a b"',
        "???",
    ]


def test_a_plugin_that_fails_to_load_is_an_error_that_names_it(clean_environment, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_KIT_PLUGINS", "not_a_real_module_xyz")
    assert main(["plugins"]) == 1
    assert "GRPO_KIT_PLUGINS names 'not_a_real_module_xyz'" in capsys.readouterr().err


def test_overrides_are_pointed_to_the_training_app(capsys):
    assert main(["+loss=dapo", "+reward=accuracy"]) == 2
    assert "python -m grpo_kit +loss=dapo +reward=accuracy" in capsys.readouterr().err


def test_no_command_prints_the_commands(capsys):
    assert main([]) == 2
    assert "plugins" in capsys.readouterr().err


def test_the_console_script_is_this_program():
    declared = re.search(r'^grpo-kit = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert declared == "grpo_kit.cli.commands:main"
    installed = [ep.value for ep in importlib.metadata.entry_points(group="console_scripts", name="grpo-kit")]
    assert installed == [declared], (
        f"the installed grpo-kit script runs {installed}, pyproject.toml declares {declared}: "
        f"re-run `{Path(sys.executable).parent / 'pip'} install -e .` to regenerate it"
    )


def test_every_command_with_an_override_like_argument_runs(tmp_path, capsys):
    # `report DIR --baseline loss=grpo` carries a `=`, yet it is a command, not a training run.
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert set(COMMANDS) == set(subcommands)
    assert main(["report", str(tmp_path / "empty"), "--baseline", "loss=grpo"]) == 1
    assert "does not train" not in capsys.readouterr().err
