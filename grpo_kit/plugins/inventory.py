"""What is installed: every registered plugin with its distribution and its options, for `grpo-kit plugins`.

A plugin's description is the first paragraph of its implementation's docstring, else of its module's, read from
the source: listing the plugins imports none of them (grpo_kit/plugins/registry.py).

An option's help text is the field's `metadata["help"]` when it has one, else the comment the house style puts
on the field's line in the config dataclass (`epsilon: float = 0.2  # lower clip ...`), else the comment lines
just above the field. Reading the source keeps plugin authors from writing each explanation twice.
"""

import ast
import dataclasses
import enum
import functools
import importlib.util
import inspect
import io
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from typing import Any

from grpo_kit.contract.kinds import KINDS, MULTI_CHOICE_KINDS
from grpo_kit.plugins.registry import Plugin, Registry, qualified_name

REQUIRED = "???"  # how Hydra writes a value that must be given


@dataclass(frozen=True)
class Option:
    name: str
    type: str
    default: Any  # a JSON-friendly value; REQUIRED when the field has no default
    help: str


@dataclass(frozen=True)
class InstalledPlugin:
    distribution: str  # "grpo-kit-losses", or "local module mylab.losses" for GRPO_KIT_PLUGINS modules
    version: str | None  # None for a local module
    kind: str
    name: str
    description: str  # one line: what the plugin does
    implementation: str  # "package.module:QualifiedName"
    config: str | None  # the config dataclass, same form; None when no import path leads to it (no options)
    options: list[Option]

    @property
    def option_prefix(self) -> str:
        """What a command line puts before an option's name: `loss.` or, for rewards and hooks, `reward.NAME.`."""
        return f"{self.kind}.{self.name}." if self.kind in MULTI_CHOICE_KINDS else f"{self.kind}."

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def installed_plugins(registry: Registry | None = None, kinds: tuple[str, ...] = KINDS) -> list[InstalledPlugin]:
    """Every registered plugin of `kinds`, kind by kind, then by name."""
    registry = registry or Registry()
    return [describe(plugin) for kind in kinds for plugin in registry.plugins(kind)]


def describe(plugin: Plugin) -> InstalledPlugin:
    distribution, version = split_distribution(plugin.distribution)
    return InstalledPlugin(
        distribution=distribution,
        version=version,
        kind=plugin.kind,
        name=plugin.name,
        description=description(plugin.implementation_path),
        implementation=plugin.implementation_path,  # listing the plugins imports none of them
        config=import_path(plugin.config),
        options=config_options(plugin.config),
    )


def import_path(klass: type) -> str | None:
    """ "package.module:Name" when importing that gives `klass` back. The registry makes a config for a plugin
    registered without one (dataclasses.make_dataclass), which no import path reaches: None, not a made-up path."""
    path = qualified_name(klass)
    module_name, _, qualname = path.partition(":")
    found = sys.modules.get(module_name)
    for name in qualname.split("."):
        found = getattr(found, name, None)
    return path if found is klass else None


DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def description(implementation_path: str) -> str:
    """The first paragraph of the implementation's docstring, else of its module's, as one line ("" if neither)."""
    module_name, _, qualname = implementation_path.partition(":")
    module = _module_syntax_tree(module_name)
    if module is None:
        return ""
    node = module
    for name in qualname.split("."):
        children = getattr(node, "body", [])
        node = next((child for child in children if isinstance(child, DEFINITIONS) and child.name == name), None)
    docstring = (node is not None and ast.get_docstring(node)) or ast.get_docstring(module) or ""
    return " ".join(docstring.split("\n\n")[0].split())


def _module_syntax_tree(module_name: str) -> ast.Module | None:
    """The module's source, parsed and not run; None when there is no source to read, or when finding it would
    import its package (find_spec does), which a plugin's entry point has imported already if they share one."""
    package = module_name.rpartition(".")[0]
    if package and package not in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(module_name)
        source = spec.loader.get_source(module_name) if spec and spec.loader else None
        return ast.parse(source) if source else None
    except (ImportError, ValueError, SyntaxError, OSError):
        return None


def split_distribution(distribution: str) -> tuple[str, str | None]:
    """("grpo-kit-losses", "0.1.0") from the registry's "grpo-kit-losses 0.1.0"; a local module has no version."""
    if distribution.startswith("local module ") or " " not in distribution:
        return distribution, None
    name, version = distribution.rsplit(" ", 1)
    return name, version


def config_options(config: type) -> list[Option]:
    """One Option per field of the config dataclass, inherited fields included, in declaration order."""
    return [
        Option(name=f.name, type=type_name(f.type), default=_default(f), help=field_help(config, f))
        for f in dataclasses.fields(config)
        if f.init
    ]


def type_name(annotation: Any) -> str:
    if isinstance(annotation, str):  # `from __future__ import annotations` leaves annotations as text
        return annotation
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return _jsonable(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _jsonable(f.default_factory())
    return REQUIRED


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # as Hydra reads and writes it
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def field_help(config: type, f: dataclasses.Field) -> str:
    """The field's help: metadata["help"], else the comment on its line in the class that declares it."""
    if f.metadata.get("help"):
        return str(f.metadata["help"])
    declaring = next((klass for klass in config.__mro__ if f.name in inspect.get_annotations(klass)), None)
    return _comments_of_fields(declaring).get(f.name, "") if declaring is not None else ""


@functools.cache
def _comments_of_fields(klass: type) -> dict[str, str]:
    """Field name -> its trailing comment, or the comment lines right above it, in `klass`'s own source."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):  # made at run time (dataclasses.make_dataclass), or no source shipped
        return {}
    trailing: dict[int, str] = {}  # line -> comment after code on that line
    standalone: dict[int, str] = {}  # line -> comment that is the whole line
    code_lines: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            line = token.start[0]
            if token.type == tokenize.COMMENT:
                text = token.string.lstrip("#").strip()
                (trailing if line in code_lines else standalone)[line] = text
            elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                code_lines.add(line)
        class_node = ast.parse(source).body[0]
    except (tokenize.TokenError, SyntaxError, IndexError):
        return {}
    comments = {}
    for node in getattr(class_node, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        on_the_line = [trailing[line] for line in range(node.lineno, node.end_lineno + 1) if line in trailing]
        above, line = [], node.lineno - 1
        while line in standalone:
            above.insert(0, standalone[line])
            line -= 1
        comments[node.target.id] = " ".join(on_the_line or above)
    return comments
