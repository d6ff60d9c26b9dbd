"""What a plugin may import is public API: the built-in plugins and the example plugin import nothing else of
grpo_kit, so that a plugin written like them keeps working when the core's insides move."""

import ast
from pathlib import Path

import grpo_kit

ROOT = Path(__file__).resolve().parent.parent
# The packages whose every module is public: the contract a plugin is written against, and the kit it is tested with.
PUBLIC_PACKAGES = ("grpo_kit.contract", "grpo_kit.testing")
# docs/plugins/README.md, "What a plugin may import", names each of these.
PUBLIC_MODULES = {
    "grpo_kit",
    *PUBLIC_PACKAGES,
    *(
        f"{package}.{path.stem}"
        for package in PUBLIC_PACKAGES
        for path in (ROOT / package.replace(".", "/")).glob("*.py")
        if path.stem != "__init__"
    ),
    # A sub-package is public as a whole (grpo_kit.testing.contracts): how its modules divide it is its own affair.
    *(
        f"{package}.{path.parent.name}"
        for package in PUBLIC_PACKAGES
        for path in (ROOT / package.replace(".", "/")).glob("*/__init__.py")
    ),
}
PLUGIN_SOURCES = [
    *ROOT.glob("plugins/grpo_kit_*/grpo_kit_*/**/*.py"),
    *ROOT.glob("docs/plugins/example/grpo_kit_*/**/*.py"),
]


def grpo_kit_imports(path: Path) -> set[str]:
    """The grpo_kit modules `path` imports (`from grpo_kit.x import y` -> grpo_kit.x; `import grpo_kit.x.y` too)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {module for module in modules if module == "grpo_kit" or module.startswith("grpo_kit.")}


def test_plugins_import_only_the_public_api():
    assert len(PLUGIN_SOURCES) > 30
    private = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in PLUGIN_SOURCES
        for module in grpo_kit_imports(path)
        if module not in PUBLIC_MODULES
    }
    assert private == set(), "a plugin needs this: make it public API and add it to docs/plugins/README.md"


def test_the_plugin_guide_names_every_public_module():
    section = (ROOT / "docs/plugins/README.md").read_text().split("## What a plugin may import")[1].split("\n## ")[0]
    assert {module for module in PUBLIC_MODULES if f"`{module}`" not in section} == set()


def test_what_hooks_and_plugins_are_handed_is_importable_from_grpo_kit():
    for name in (
        "hookimpl",
        "Loss",
        "ImportanceSampling",
        "RolloutCorrection",
        "Advantage",
        "Generation",
        "Environment",
        "CustomRollout",
        "Reward",
        "GenerationConfig",
        "RewardConfig",
        "Completions",
        "LossInputs",
        "Reduction",
        "RolloutResult",
        "ConfigError",
        "Run",
        "ScoredBatch",
        "eos_token_ids",
        "eos_mask",
        "is_truncated",
    ):
        assert name in grpo_kit.__all__ and getattr(grpo_kit, name) is not None
