"""The reproducibility lock records the plugin set and warns when a run meets another one."""

import json
import logging

import grpo_kit
from grpo_kit.lock import LOCK_FILE, current_lock, differences, write_or_compare
from grpo_kit.plugins import Registry, plugin_manager


def test_lock_records_distributions_entry_points_and_config_hash(registry):
    cfg = grpo_kit.compose(["+reward=accuracy"], registry)
    lock = current_lock(registry, cfg)
    assert lock["plugins"]["loss/dapo"].startswith("grpo-kit-losses ")
    assert lock["entry_points"]["grpo_kit_losses"]["value"] == "grpo_kit_losses.plugin"
    assert len(lock["config_sha256"]) == 64
    assert differences(lock, current_lock(registry, cfg)) == []


def test_a_different_plugin_set_is_listed(registry, local_plugin, tmp_path, caplog):
    cfg = grpo_kit.compose(["+reward=accuracy"], registry)
    write_or_compare(tmp_path, registry, cfg)
    recorded = json.loads((tmp_path / LOCK_FILE).read_text())
    module = local_plugin("lock_extra", """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("grpo_copy", GRPO)
    """)
    other = Registry(plugin_manager(local_modules=[module], disabled=["cispo"]))
    with caplog.at_level(logging.WARNING):
        write_or_compare(tmp_path, other, grpo_kit.compose(["+reward=accuracy", "seed=7"], other))
    assert "plugins loss/grpo_copy: (absent) -> local module lock_extra" in caplog.text
    assert "plugins loss/cispo: grpo-kit-losses" in caplog.text and "-> (absent)" in caplog.text
    assert "the resolved config differs" in caplog.text
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == recorded  # the original record is kept
