"""The reproducibility lock records what trained a run's steps, and warns when a resumed run meets other code."""

import json
import logging

import pytest

import grpo_kit
from grpo_kit.outputs.plugin_lock import LOCK_FILE, current_lock, differences, record_session
from grpo_kit.plugins.registry import Registry, plugin_manager


def sessions(run_dir):
    return json.loads((run_dir / LOCK_FILE).read_text())["sessions"]


def test_lock_records_distributions_entry_points_and_config_hash(registry):
    cfg = grpo_kit.compose(["+reward=accuracy"], registry)
    lock = current_lock(registry, cfg)
    assert lock["plugins"]["loss/dapo"].startswith("grpo-kit-losses ")
    assert lock["entry_points"]["grpo_kit_losses"]["value"] == "grpo_kit_losses.plugin"
    assert len(lock["config_sha256"]) == 64
    assert differences(lock, current_lock(registry, cfg)) == []


@pytest.fixture
def other_registry(registry, local_plugin):
    """The installed plugins less cispo, and one more loss."""
    module = local_plugin(
        "lock_extra",
        """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("grpo_copy", GRPO)
    """,
    )
    return Registry(plugin_manager(local_modules=[module], disabled=["cispo"]))


def test_a_resumed_session_with_other_plugins_is_warned_about_and_recorded(registry, other_registry, tmp_path, caplog):
    record_session(tmp_path, registry, grpo_kit.compose(["+reward=accuracy"], registry), start_step=0)
    first = sessions(tmp_path)[0]
    with caplog.at_level(logging.WARNING):
        record_session(
            tmp_path, other_registry, grpo_kit.compose(["+reward=accuracy", "seed=7"], other_registry), start_step=3
        )
    assert "The steps up to 3 of this run were trained with other plugins" in caplog.text
    assert "plugins loss/grpo_copy: (absent) -> local module lock_extra" in caplog.text
    assert "plugins loss/cispo: grpo-kit-losses" in caplog.text and "-> (absent)" in caplog.text
    assert "the resolved config differs" in caplog.text
    recorded = sessions(tmp_path)
    assert recorded[0] == first and [session["from_step"] for session in recorded] == [0, 3]
    assert recorded[1]["plugins"]["loss/grpo_copy"] == "local module lock_extra"


def test_an_attempt_whose_steps_are_not_kept_is_replaced_without_a_warning(registry, other_registry, tmp_path, caplog):
    cfg, other = (
        grpo_kit.compose(["+reward=accuracy"], registry),
        grpo_kit.compose(["+reward=accuracy"], other_registry),
    )
    record_session(tmp_path, other_registry, other, start_step=0)
    with caplog.at_level(logging.WARNING):
        record_session(tmp_path, registry, cfg, start_step=0)  # the first attempt failed before its first step
    assert warnings(caplog) == []
    assert sessions(tmp_path) == [{"from_step": 0, **current_lock(registry, cfg)}]
    record_session(tmp_path, other_registry, other, start_step=3)
    record_session(tmp_path, registry, cfg, start_step=3)  # the session from step 3 saved no checkpoint
    assert sessions(tmp_path) == [{"from_step": 0, **current_lock(registry, cfg)}]


def test_resuming_with_trainer_resume_or_other_resumable_settings_is_the_same_lock(registry, tmp_path, caplog):
    base = ["+reward=accuracy"]
    record_session(tmp_path, registry, grpo_kit.compose(base, registry), start_step=0)
    resumed = grpo_kit.compose([*base, "trainer.resume=auto", "trainer.progress_bar=false"], registry)
    with caplog.at_level(logging.WARNING):
        record_session(tmp_path, registry, resumed, start_step=5)
    assert warnings(caplog) == []
    assert [session["from_step"] for session in sessions(tmp_path)] == [0]


def warnings(caplog) -> list[str]:
    """What was logged at WARNING or above: composing a config may log at INFO (the default loss) first."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
