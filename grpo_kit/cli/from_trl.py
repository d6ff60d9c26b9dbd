"""`grpo-kit from-trl RECIPE.yaml [--write FILE]`: a TRL or open-r1 recipe as the grpo_kit command that runs it, or
as an experiment file. `--table` prints docs/trl.md's table of every field instead.

The translation is grpo_kit/config/trl_recipe.py's; here it is printed. A recipe with a field grpo_kit cannot carry
over prints each such field with its reason and the nearest grpo_kit option, and exits 1.
"""

import argparse
import shlex
import sys
from pathlib import Path

from grpo_kit.config.trl_entries import Mapped, NotApplicable, kind
from grpo_kit.config.trl_fields import GRPO_CONFIG_FIELDS
from grpo_kit.config.trl_overrides import experiment_yaml, hydra_overrides
from grpo_kit.config.trl_recipe import read_recipe, recipe_overrides, translate
from grpo_kit.config.trl_script_fields import SCRIPT
from grpo_kit.contract.errors import ConfigError

TRL_FLAG = "--trl-config"
DESCRIPTION = (
    "Read a TRL or open-r1 recipe (the YAML of `trl grpo --config`) and print the `python -m grpo_kit` command "
    "that runs it; every field is mapped, or refused with the reason and the nearest grpo_kit option. "
    "`python -m grpo_kit --trl-config RECIPE.yaml [OVERRIDES]` runs one directly."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="the recipe's YAML file")
    parser.add_argument(
        "--write",
        metavar="FILE",
        help="also write an experiment file (in a folder named experiment/, as conf/experiment/NAME.yaml)",
    )
    parser.add_argument("--table", action="store_true", help="print the table of every TRL field (docs/trl.md)")


def from_trl_command(args: argparse.Namespace) -> int:
    if args.table:
        print(markdown_table())
        return 0
    if not args.recipe:
        print("error: name the recipe: grpo-kit from-trl RECIPE.yaml", file=sys.stderr)
        return 2
    try:
        translation = translate(read_recipe(args.recipe))
        if translation.notes:
            print(f"Fields that do nothing in grpo_kit:\n{translation.notes_text()}", file=sys.stderr)
        if translation.refusals:
            raise ConfigError(translation.refused_text())
        command = run_command(hydra_overrides(translation.overrides))
        if args.write:
            write_experiment(Path(args.write), args.recipe, translation.overrides)
            command = experiment_command(Path(args.write))
    except ConfigError as error:
        print(f"error: {args.recipe}: {error}", file=sys.stderr)
        return 1
    print(command)
    return 0


def run_command(overrides: list[str]) -> str:
    return shlex.join(["python", "-m", "grpo_kit", *overrides])


def experiment_command(path: Path) -> str:
    """The command that runs the experiment file at `path`: Hydra finds experiments in a config folder's
    experiment/ subfolder."""
    if path.resolve().parent.name != "experiment":
        raise ConfigError(f"--write {path}: put the file in a folder named experiment/, where Hydra looks for it")
    return shlex.join(
        ["python", "-m", "grpo_kit", f"--config-dir={path.resolve().parent.parent}", f"+experiment={path.stem}"]
    )


def write_experiment(path: Path, recipe: str, overrides: dict) -> None:
    command = experiment_command(path)
    header = [command, f"Translated by `grpo-kit from-trl {recipe}` (docs/trl.md says what each TRL field becomes)."]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(experiment_yaml(overrides, header))


def markdown_table() -> str:
    """One row per field: docs/trl.md holds this table, and tests/test_trl_fields.py checks that it is current."""
    rows = ["| TRL field | in grpo_kit | grpo_kit option, or why |", "|---|---|---|"]
    for name, entry in {**GRPO_CONFIG_FIELDS, **SCRIPT}.items():
        if isinstance(entry, Mapped):
            said = f"`{entry.key}`" + (f" ({entry.note})" if entry.note else "")
        elif isinstance(entry, NotApplicable):
            said = entry.why
        else:
            said = f"{entry.reason}; nearest: {entry.nearest}"
        rows.append(f"| `{name}` | {kind(entry)} | {said.replace('|', '/')} |")
    return "\n".join(rows)


def with_trl_recipe(argv: list[str]) -> list[str]:
    """`python -m grpo_kit --trl-config RECIPE.yaml [OVERRIDES]`: the flag replaced by the recipe's overrides, less
    those whose key the command line sets itself (its value wins, as a later override would)."""
    flags = [index for index, arg in enumerate(argv) if arg == TRL_FLAG or arg.startswith(f"{TRL_FLAG}=")]
    if not flags:
        return argv
    if len(flags) > 1:
        raise ConfigError(f"{TRL_FLAG} is given {len(flags)} times: name one recipe")
    index = flags[0]
    flag, _, path = argv[index].partition("=")
    if not path:
        if index + 1 >= len(argv):
            raise ConfigError(f"{TRL_FLAG} needs a file: {TRL_FLAG} RECIPE.yaml")
        path = argv[index + 1]
    rest = argv[:index] + argv[index + (1 if "=" in argv[index] else 2) :]
    translation = recipe_overrides(path)
    if translation.notes:
        print(f"{path}: fields that do nothing in grpo_kit:\n{translation.notes_text()}", file=sys.stderr)
    given = {override_key(arg) for arg in rest if "=" in arg and not arg.startswith("-")}
    recipe = [override for override in hydra_overrides(translation.overrides) if override_key(override) not in given]
    return rest[:index] + recipe + rest[index:]


def override_key(override: str) -> str:
    """`+reward@reward.x=python` -> reward, `~trainer.lr=1` -> trainer.lr: the key an override sets."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
