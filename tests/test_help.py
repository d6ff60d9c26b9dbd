"""Help and discovery: `python -m grpo_kit --help` says how to choose plugins and presets, and `grpo-kit plugins`
says what each plugin does and what each of its options means."""

import dataclasses
import importlib
import importlib.resources
import inspect
import json
import re
import shutil
import sys
from pathlib import Path

import grpo_kit.config.presets
from grpo_kit.cli import main as cli
from grpo_kit.cli.commands import main as grpo_kit_command
from grpo_kit.config.presets import NOT_PRESETS, PRESETS_MODULE
from grpo_kit.config.schema import DEFAULT_CHOICES
from grpo_kit.contract.kinds import KINDS
from grpo_kit.plugins.inventory import field_help

ROOT = Path(__file__).parents[1]
BUILT_IN_DISTRIBUTIONS = [
    re.search(r'^name = "(.*)"$', pyproject.read_text(), re.MULTILINE).group(1)
    for pyproject in [*ROOT.glob("plugins/*/pyproject.toml"), ROOT / "docs/plugins/example/pyproject.toml"]
]


def cli_help(monkeypatch, capsys, *overrides) -> str:
    monkeypatch.setattr(sys, "argv", ["grpo_kit", *overrides, "--help"])
    cli.main()
    return capsys.readouterr().out


def section(text: str, title: str) -> dict[str, str]:
    """The `choice  names` rows of the help section whose heading starts with `title`."""
    lines = text.split(f"== {title}", 1)[1].splitlines()[1:]
    rows = [line for line in lines[: lines.index("")] if not line.startswith("`")]
    return dict(re.split(r"\s{2,}", row, maxsplit=1) for row in rows)


def listed(capsys, *args) -> dict[tuple[str, str], dict]:
    assert grpo_kit_command(["plugins", "--json", *args]) == 0
    return {(plugin["kind"], plugin["name"]): plugin for plugin in json.loads(capsys.readouterr().out)}


def test_help_says_how_to_choose_each_kind_of_plugin(registry, monkeypatch, capsys):
    text = cli_help(monkeypatch, capsys)
    plugins = section(text, "Plugins")
    assert list(plugins) == [f"+{kind}=NAME" for kind in KINDS]
    assert "dapo (default)" in plugins["+loss=NAME"].split(", ")
    for kind in KINDS:
        names = [name.removesuffix(" (default)") for name in plugins[f"+{kind}=NAME"].split(", ")]
        assert names == (registry.names(kind) or ["(none installed)"])
        assert (DEFAULT_CHOICES.get(kind) in registry.names(kind)) == ("(default)" in plugins[f"+{kind}=NAME"])
    assert "+reward=[a,b]" in text
    assert "`grpo-kit plugins` says what each plugin does" in text


def test_help_lists_every_preset_in_conf(registry, monkeypatch, capsys):
    presets = section(cli_help(monkeypatch, capsys), "Presets")
    listed_groups = {re.search(r"\+?([\w/]+)=NAME", choice).group(1): names for choice, names in presets.items()}
    conf = Path(str(importlib.resources.files(PRESETS_MODULE)))
    in_conf = {}
    for preset in conf.rglob("*.yaml"):
        group = preset.parent.relative_to(conf).as_posix()
        if group.split("/")[0] not in NOT_PRESETS:
            in_conf.setdefault(group, []).append(preset.stem)
    assert {group: names.split(", ") for group, names in listed_groups.items()} == {
        group: sorted(names) for group, names in in_conf.items()
    }
    assert presets["model=NAME"] and presets["+experiment=NAME"] and presets["-m hydra/launcher=NAME"]


def test_a_new_preset_or_group_is_listed_without_a_change_to_the_code(registry, tmp_path, monkeypatch):
    conf = tmp_path / "my_conf"
    shutil.copytree(Path(str(importlib.resources.files(PRESETS_MODULE))), conf)
    (conf / "experiment" / "mine.yaml").write_text("# @package _global_\nseed: 1\n")
    (conf / "curriculum").mkdir()
    (conf / "curriculum" / "easy_first.yaml").write_text("# @package _global_\nseed: 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(grpo_kit.config.presets, "PRESETS_MODULE", "my_conf")

    text = cli.help_text([], registry)

    presets = section(text, "Presets")
    assert "mine" in presets["+experiment=NAME"].split(", ")
    assert presets["+curriculum=NAME"] == "easy_first"


def test_grpo_kit_plugins_describes_each_plugin_in_one_line(registry, capsys):
    plugins = listed(capsys)
    for (kind, name), plugin in plugins.items():
        if plugin["distribution"] in BUILT_IN_DISTRIBUTIONS:
            assert plugin["description"].startswith(f"{name}: "), (kind, name, plugin["description"])
    # The class's docstring where it has one, else its module's: the corrections share a module.
    assert plugins["rollout_correction", "token_mask"]["description"].startswith("token_mask: each token's ratio")
    assert plugins["loss", "dapo"]["description"] == (
        "dapo: the clipped surrogate summed over tokens and divided by the active tokens of the whole batch."
    )

    assert grpo_kit_command(["plugins", "--kind", "loss"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "DESCRIPTION"]
    assert any(line.split()[:5] == ["loss", "dapo", "grpo-kit-losses", "0.1.0", "dapo:"] for line in lines)


def test_a_description_is_read_from_the_source_without_importing_the_implementation(
    registry, local_plugin, tmp_path, monkeypatch, capsys
):
    local_plugin(
        "never_imported",
        '''
        """The module's summary,
        over two lines.

        Details that stay out of the listing.
        """
        raise RuntimeError("grpo-kit plugins imported the implementation")


        class Documented:
            """A class's own summary."""


        def undocumented(prompts, completions, completion_ids, **columns): ...
    ''',
    )
    module = local_plugin(
        "describing_plugins",
        """
        import grpo_kit


        @grpo_kit.hookimpl
        def register_losses(register):
            register("documented", "never_imported:Documented")


        @grpo_kit.hookimpl
        def register_rewards(register):
            register("undocumented", "never_imported:undocumented")
            register("nowhere", "no_such_module:anything")
            register("in_a_package", "unimported_package.rewards:score")
    """,
    )
    (tmp_path / "unimported_package").mkdir()  # local_plugin's folder, on sys.path
    (tmp_path / "unimported_package" / "__init__.py").write_text('raise RuntimeError("imported the package")')
    (tmp_path / "unimported_package" / "rewards.py").write_text('def score(*args, **kwargs):\n    """Scores."""\n')
    monkeypatch.setenv("GRPO_KIT_PLUGINS", module)

    plugins = listed(capsys)

    assert plugins["loss", "documented"]["description"] == "A class's own summary."
    assert plugins["reward", "undocumented"]["description"] == "The module's summary, over two lines."
    assert plugins["reward", "nowhere"]["description"] == ""
    assert plugins["reward", "in_a_package"]["description"] == ""  # finding its source would import the package
    assert "never_imported" not in sys.modules and "unimported_package" not in sys.modules


def test_the_json_holds_import_paths_and_type_names_not_internal_values(registry, local_plugin, monkeypatch, capsys):
    module = local_plugin(
        "colour_reward",
        """
        import enum
        from dataclasses import dataclass

        import grpo_kit


        class Colour(enum.Enum):
            RED = 1
            BLUE = 2


        @dataclass
        class ColourConfig(grpo_kit.RewardConfig):
            colour: Colour = Colour.RED  # the colour rewarded


        def colour(prompts, completions, completion_ids, **options):
            return [0.0] * len(completions)


        @grpo_kit.hookimpl
        def register_rewards(register):
            register("colour", colour, ColourConfig)
    """,
    )
    monkeypatch.setenv("GRPO_KIT_PLUGINS", module)
    plugins = listed(capsys)

    # Registered without a config: the registry makes an empty one, which no import path leads to.
    assert plugins["advantage", "group"]["config"] is None and plugins["advantage", "group"]["options"] == []
    for plugin in plugins.values():
        if plugin["config"] is not None:
            module_name, _, name = plugin["config"].partition(":")
            assert dataclasses.is_dataclass(getattr(importlib.import_module(module_name), name)), plugin["config"]
    (colour_option,) = [o for o in plugins["reward", "colour"]["options"] if o["name"] == "colour"]
    assert colour_option == {"name": "colour", "type": "Colour", "default": "RED", "help": "the colour rewarded"}
    text = json.dumps(list(plugins.values()))
    for internal in ("types:", "<class", "<enum", "typing.", " object at "):
        assert internal not in text


def plugin_options(registry):
    """(plugin, option, the class that declares the option) for every option of every built-in plugin."""
    for kind in registry.kinds():
        for plugin in registry.plugins(kind):
            if plugin.distribution.split()[0] not in BUILT_IN_DISTRIBUTIONS:
                continue
            for field in dataclasses.fields(plugin.config):
                declaring = next(
                    klass for klass in plugin.config.__mro__ if field.name in inspect.get_annotations(klass)
                )
                yield plugin, field, declaring


def without_help(options) -> list[str]:
    missing = {
        f"{plugin.kind}.{field.name} ({declaring.__qualname__})"
        for plugin, field, declaring in options
        if not field_help(plugin.config, field)
    }
    return sorted(missing)


def test_every_option_a_built_in_plugin_declares_has_help(registry):
    options = [option for option in plugin_options(registry) if option[2].__module__ != "grpo_kit.contract.kinds"]
    assert len(options) > 50
    assert without_help(options) == [], "explain each option in a comment on its line (docs/plugins/README.md)"


def test_every_option_the_core_gives_plugins_has_help(registry):
    options = [option for option in plugin_options(registry) if option[2].__module__ == "grpo_kit.contract.kinds"]
    assert {field.name for _, field, _ in options} >= {"weight", "num_generations", "temperature"}
    assert without_help(options) == [], "explain each field in a comment on its line in grpo_kit/contract/kinds.py"
