"""Building an embedded model (the first run on a machine) says what it does, and a build cut short leaves nothing."""

import logging
import os
import subprocess
import sys

import pytest

from grpo_kit.embedded import sums as embedded


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_KIT_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded, "PRETRAIN_STEPS", 3)  # the build itself is not under test
    return tmp_path


def test_a_build_says_what_it_builds_that_it_does_so_once_and_where_and_shows_its_progress(
    cache, caplog, capsys, monkeypatch
):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # the bar shows on a terminal
    with caplog.at_level(logging.INFO, logger="grpo_kit.embedded.sums"):
        path = embedded.model_path()
    assert f"Building the embedded model 'sums', once: later runs load it from {path}" in caplog.text
    assert "Pretraining the embedded model (3 steps): 100%" in capsys.readouterr().err
    caplog.clear()
    assert embedded.model_path() == path and not caplog.text  # built: loaded silently


def test_an_interrupted_build_leaves_no_staging_folder(cache, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        embedded.model_path()
    assert list(cache.iterdir()) == []


def test_a_build_removes_the_staging_folders_of_killed_builds_on_this_machine_only(cache):
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    killed = cache / f"{embedded.STAGING_PREFIX}abc123-{finished.pid}"
    running = cache / f"{embedded.STAGING_PREFIX}def456-{os.getpid()}"
    elsewhere = cache / f".building-another-machine-ghi789-{finished.pid}"
    for folder in (killed, running, elsewhere):
        (folder / "part").mkdir(parents=True)
    embedded.model_path()
    assert not killed.exists() and running.exists() and elsewhere.exists()
