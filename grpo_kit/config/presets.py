"""The presets in conf/ (shipped as grpo_kit.conf): their groups and names, and the preset a model or dataset path
selects."""

import importlib.resources

PRESETS_MODULE = "grpo_kit.conf"  # conf/ in a checkout, shipped inside the wheel
NOT_PRESETS = {"accelerate"}  # conf/accelerate/ holds `accelerate launch --config_file` files, not Hydra presets

# Naming a real model or dataset selects its preset too, so that the embedded model's tuned settings
# (a high learning rate, tiny completions) never reach a real model by accident.
PRESET_FOR_PATH = {"model.name_or_path": ("model", "hf"), "data.path": ("data", "hf")}


def preset_groups() -> list[str]:
    """The top-level folders of conf/ that hold presets (experiment, model, sweep, ...)."""
    folders = [entry.name for entry in importlib.resources.files(PRESETS_MODULE).iterdir() if entry.is_dir()]
    return [name for name in folders if not name.startswith("_") and name not in NOT_PRESETS]


def preset_choices() -> dict[str, list[str]]:
    """Each preset group in conf/ (`sweep/losses` for a folder inside one) with its presets' names, sorted."""
    choices: dict[str, list[str]] = {}

    def visit(folder, group: str) -> None:
        names = sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))
        if names:
            choices[group] = names
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith("_"):
                visit(entry, f"{group}/{entry.name}")

    for entry in importlib.resources.files(PRESETS_MODULE).iterdir():
        if entry.is_dir() and not entry.name.startswith("_") and entry.name not in NOT_PRESETS:
            visit(entry, entry.name)
    return dict(sorted(choices.items()))
