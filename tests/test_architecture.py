"""The one rule: the core knows plugin kinds, never plugin names, so nothing in grpo_kit/ imports a plugin."""

import ast
import importlib.metadata
from pathlib import Path

CORE = Path(__file__).parents[1] / "grpo_kit"


def plugin_packages() -> set[str]:
    """Top-level packages of every installed grpo_kit plugin, and every folder under plugins/."""
    packages = {ep.value.split(".")[0].split(":")[0] for ep in importlib.metadata.entry_points(group="grpo_kit")}
    packages |= {path.name for path in (CORE.parent / "plugins").glob("*/*") if (path / "__init__.py").exists()}
    return packages


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                modules.add(str(node.args[0].value).split(".")[0])
    return modules


def test_plugin_packages_are_found():
    assert {"grpo_kit_losses", "grpo_kit_rewards"} <= plugin_packages()


def test_core_imports_no_plugin():
    forbidden = plugin_packages()
    offenders = {
        str(path.relative_to(CORE.parent)): sorted(imported_modules(path) & forbidden)
        for path in CORE.rglob("*.py")
        if imported_modules(path) & forbidden
    }
    assert offenders == {}


def test_core_names_no_plugin_in_its_code():
    """Default choices are config data (config.py); everywhere else the core must not name a built-in."""
    names = {"grpo_kit_losses", "grpo_kit_importance", "grpo_kit_advantages", "grpo_kit_rewards"}
    for path in CORE.rglob("*.py"):
        assert not any(name in path.read_text() for name in names), path
