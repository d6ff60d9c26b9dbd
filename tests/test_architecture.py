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


# The layers from the bottom up: a module may import its own layer and those below it, never one above.
# docs/architecture.md draws them.
LAYERS = [
    "contract",
    "embedded",
    "plugins",
    "config",
    "model",
    "objective",
    "rollout",
    "outputs",
    "report",
    "training",
    "cli",
    "testing",
]


def grpo_kit_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every grpo_kit module `path` imports, at the top or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "grpo_kit" else []
            found += [(node.lineno, module) for module in [node.module, *names]]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, module) for line, module in found if module.startswith("grpo_kit.")]


def test_every_module_lives_in_a_layer():
    loose = {path.name for path in CORE.glob("*.py")} - {"__init__.py", "__main__.py"}
    assert loose == set(), "put each module in the sub-package of its layer"
    assert {path.name for path in CORE.iterdir() if (path / "__init__.py").exists()} == set(LAYERS)


def test_imports_go_only_downward():
    upward = []
    for path in CORE.rglob("*.py"):
        parts = path.relative_to(CORE).parts
        if len(parts) == 1:  # grpo_kit/__init__.py exports the public API; __main__.py runs the CLI
            continue
        for line, module in grpo_kit_imports(path):
            imported = module.split(".")[1]
            if imported in LAYERS and LAYERS.index(imported) > LAYERS.index(parts[0]):
                upward.append(f"{path.relative_to(CORE.parent)}:{line} ({parts[0]}) imports {module} ({imported})")
    assert upward == []


def test_the_layer_test_sees_an_upward_import(tmp_path):
    module = tmp_path / "leaky.py"
    module.write_text("def f():\n    from grpo_kit.training.loop import train\n")
    assert grpo_kit_imports(module) == [(2, "grpo_kit.training.loop")]


def test_no_layer_shadows_a_public_name():
    """`grpo_kit.train` is the function: a sub-package of that name would replace it once imported."""
    import grpo_kit

    assert set(LAYERS) & set(grpo_kit.__all__) == set()


def test_the_training_loop_reads_in_one_sitting():
    """grpo_kit/training/loop.py is setup, then generate -> score -> advantages -> log-probs -> loss -> step, end of
    step: what does not tell that story lives in the modules it calls."""
    assert len((CORE / "training" / "loop.py").read_text().splitlines()) < 150


def module_name(path: Path) -> str:
    """grpo_kit/config/compose.py -> grpo_kit.config.compose; a package's __init__.py -> the package."""
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module under grpo_kit/ with the grpo_kit modules it imports, at the top or inside a function
    (`from grpo_kit.model import vision` imports grpo_kit.model.vision)."""
    modules = {module_name(path): path for path in CORE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                imported |= submodules or {node.module}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[name] = (imported & modules.keys()) - {name}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One chain of imports that comes back to the module it starts from (a, b, a), or [] when there is none."""
    no_cycle_below = set()

    def visit(module: str, chain: list[str]) -> list[str]:
        if module in chain:
            return chain[chain.index(module) :] + [module]
        if module in no_cycle_below:
            return []
        for imported in sorted(graph[module]):
            if cycle := visit(imported, chain + [module]):
                return cycle
        no_cycle_below.add(module)
        return []

    for module in sorted(graph):
        if cycle := visit(module, []):
            return cycle
    return []


def test_no_module_imports_itself_through_others():
    """A circle of imports works only in the order Python happens to meet it (hence imports hidden in functions),
    and leaves neither module readable without the other: the modules of a circle belong in one, or a third."""
    assert import_cycle(import_graph()) == []


def test_the_cycle_test_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": set()}
    assert import_cycle(graph) == ["b", "c", "b"]
    assert import_cycle({"a": {"b"}, "b": set()}) == []


MAX_FUNCTION_LINES = 80
# Functions allowed to be longer, each with why: a renderer is one long template, read top to bottom.
LONG_FUNCTIONS = {("report/markdown.py", "render"): "the sweep report's Markdown, section after section"}


def long_functions(root: Path) -> list[tuple[str, str, int]]:
    """(module path under `root`, function name, lines) of every function longer than MAX_FUNCTION_LINES."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append((path.relative_to(root).as_posix(), node.name, lines))
    return found


def test_no_function_runs_over_80_lines():
    too_long = [found for found in long_functions(CORE) if found[:2] not in LONG_FUNCTIONS]
    assert too_long == [], "cut these into named steps (or list one in LONG_FUNCTIONS, with why)"


def test_the_length_test_sees_a_long_function(tmp_path):
    (tmp_path / "long.py").write_text("def long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert long_functions(tmp_path) == [("long.py", "long", MAX_FUNCTION_LINES + 1)]


def dict_micro_batches(root: Path) -> list[str]:
    """Parameters and returns of the code under `root` that carry a micro-batch (a name with "batch" in it) as a
    dict or a list of dicts instead of a MicroBatch."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            annotated = [(arg.arg, arg.annotation) for arg in node.args.args + node.args.kwonlyargs]
            if "batch" in node.name:
                annotated.append(("return", node.returns))
            for name, annotation in annotated:
                shown = "" if annotation is None else ast.unparse(annotation)
                if "batch" in name.lower() + node.name and shown.startswith(("dict[str, torch.Tensor]", "list[dict")):
                    found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name}({name}: {shown})")
    return found


def test_no_micro_batch_travels_as_a_dict():
    assert dict_micro_batches(CORE) == [], "a micro-batch is a MicroBatch (grpo_kit/contract/micro_batch.py)"


def test_the_micro_batch_test_sees_a_dict(tmp_path):
    (tmp_path / "old.py").write_text("def train_on(micro_batch: dict[str, torch.Tensor]) -> None: ...\n")
    assert dict_micro_batches(tmp_path) == ["old.py:1 train_on(micro_batch: dict[str, torch.Tensor])"]


def test_docs_architecture_names_every_module():
    """docs/architecture.md's table is the map: a module it does not name is one a newcomer cannot find."""
    page = (CORE.parent / "docs" / "architecture.md").read_text()
    modules = [path.relative_to(CORE).as_posix() for path in CORE.rglob("*.py") if path.name != "__init__.py"]
    assert sorted(module for module in modules if f"| `{module}` |" not in page) == []
