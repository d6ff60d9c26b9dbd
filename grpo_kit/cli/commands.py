"""`grpo-kit`: commands about an installation. Training itself is the Hydra app, `python -m grpo_kit OVERRIDES...`.

    grpo-kit plugins               every installed plugin: its distribution, what it does, its options and defaults
    grpo-kit plugins --json        the same as JSON
    grpo-kit plugins --kind loss   one kind only
    grpo-kit report DIR            a sweep's report.md, runs.csv, variants.csv and figures, written into DIR
    grpo-kit eval RUN_DIR [K=V]    a run's model (or a checkpoint, or a model folder) on eval sets: eval.json
    grpo-kit from-trl RECIPE.yaml  a TRL or open-r1 recipe as the grpo_kit command that runs it (docs/trl.md)

A new command is a function `NAME_command(args) -> int` plus its parser in `build_parser`.
"""

import argparse
import json
import os
import re
import sys

from grpo_kit.cli.evaluate import DESCRIPTION as EVAL_DESCRIPTION
from grpo_kit.cli.evaluate import add_arguments as add_eval_arguments
from grpo_kit.cli.evaluate import eval_command
from grpo_kit.cli.from_trl import DESCRIPTION as FROM_TRL_DESCRIPTION
from grpo_kit.cli.from_trl import add_arguments as add_from_trl_arguments
from grpo_kit.cli.from_trl import from_trl_command
from grpo_kit.contract.errors import PluginError
from grpo_kit.contract.kinds import KINDS
from grpo_kit.plugins.inventory import InstalledPlugin, installed_plugins
from grpo_kit.report.command import DESCRIPTION as REPORT_DESCRIPTION
from grpo_kit.report.command import add_arguments as add_report_arguments
from grpo_kit.report.command import report_command

COMMANDS = ("plugins", "report", "eval", "from-trl")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if looks_like_training(argv):
        # Before `grpo-kit plugins` existed, this script was the training app: say where training went.
        print(
            f"error: grpo-kit does not train. Run `python -m grpo_kit {' '.join(argv)}` to train; "
            "`grpo-kit plugins` lists the plugins and options you can choose.",
            file=sys.stderr,
        )
        return 2
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.run(args)
    except PluginError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `grpo-kit plugins | head` closed the pipe early: not an error
        # Point stdout at /dev/null, so that flushing it at exit does not raise again (Python's advice).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def looks_like_training(argv: list[str]) -> bool:
    """Hydra overrides (`+loss=dapo`, `-m seed=0,1`) where a command should be."""
    return bool(argv) and argv[0] not in COMMANDS and any("=" in arg and not arg.startswith("--") for arg in argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-kit",
        description="About this grpo_kit installation. To train, run `python -m grpo_kit OVERRIDES...`.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugins = commands.add_parser(
        "plugins",
        help="list the installed plugins and their options",
        description="Every installed plugin: its distribution, kind and name, what it does, and its options with "
        "their defaults and help, written as the command-line override that sets them.",
    )
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugins.add_argument("--kind", choices=KINDS, action="append", help="only this kind (repeatable)")
    plugins.set_defaults(run=plugins_command)
    report = commands.add_parser(
        "report",
        help="write a sweep's report: tables and figures that compare its runs",
        description=REPORT_DESCRIPTION,
    )
    add_report_arguments(report)
    report.set_defaults(run=report_command)
    evaluation = commands.add_parser(
        "eval",
        help="evaluate a run's model, a checkpoint or a model folder, without training",
        description=EVAL_DESCRIPTION,
    )
    add_eval_arguments(evaluation)
    evaluation.set_defaults(run=eval_command)
    from_trl = commands.add_parser(
        "from-trl",
        help="a TRL or open-r1 recipe as the grpo_kit command that runs it",
        description=FROM_TRL_DESCRIPTION,
    )
    add_from_trl_arguments(from_trl)
    from_trl.set_defaults(run=from_trl_command)
    return parser


def plugins_command(args: argparse.Namespace) -> int:
    plugins = installed_plugins(kinds=tuple(args.kind) if args.kind else KINDS)
    if args.json:
        print(json.dumps([plugin.as_dict() for plugin in plugins], indent=2))
    else:
        print(plugins_table(plugins))
    return 0


def plugins_table(plugins: list[InstalledPlugin]) -> str:
    """One line per plugin, which ends with what it does, then one indented line per option:
    `loss.epsilon=0.2  float  lower clip: ...`."""
    if not plugins:
        return "No grpo_kit plugins are installed: `pip install -r requirements.txt` installs the built-in ones."
    header = ("KIND", "NAME", "DISTRIBUTION", "VERSION", "DESCRIPTION")
    rows = [(p.kind, p.name, p.distribution, p.version or "-", p.description) for p in plugins]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = [_aligned(header, widths)]
    for index, (plugin, row) in enumerate(zip(plugins, rows)):
        if index and plugin.kind != plugins[index - 1].kind:
            lines.append("")  # a blank line between kinds
        lines.append(_aligned(row, widths))
        options = [(f"{plugin.option_prefix}{o.name}={hydra_value(o.default)}", o.type, o.help) for o in plugin.options]
        option_widths = [max((len(option[column]) for option in options), default=0) for column in (0, 1)]
        lines += ["    " + _aligned(option, option_widths + [0]) for option in options]
    return "\n".join(lines)


def _aligned(cells, widths) -> str:
    return "  ".join(f"{cell:<{width}}" for cell, width in zip(cells, widths)).rstrip()


_PLAIN = re.compile(r"^[\w.+\-/:*]+$|^\$\{[^}]*\}$|^\?\?\?$")  # what Hydra reads unquoted


def hydra_value(value) -> str:
    """A default as a Hydra override writes it: null, true, 0.2, dapo, ${generation.max_completion_length}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value and _PLAIN.match(value) else json.dumps(value)
    return json.dumps(value)


if __name__ == "__main__":
    sys.exit(main())
