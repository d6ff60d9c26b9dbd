"""A secret option (contract/secrets.py) reaches its plugin, and no file or log of a run or its report."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import grpo_kit
from grpo_kit.cli import commands
from grpo_kit.config.secrets import REDACTED, redacted, redacted_overrides, secret_paths
from grpo_kit.outputs.checkpoints import resume_command

LITERAL = "sk-literal-0123456789"  # given on the command line as it is
FROM_ENV = "sk-from-env-9876543210"  # given as '${oc.env:KEYED_TOKEN}'

KEYED_REWARD = f"""
    from dataclasses import dataclass

    import grpo_kit
    from grpo_kit.contract.secrets import secret

    @dataclass
    class KeyedConfig(grpo_kit.RewardConfig):
        token: str | None = secret()

    def keyed(prompts, completions, completion_ids, token, **columns):
        assert token in ({LITERAL!r}, {FROM_ENV!r}), "the plugin must get the secret itself"
        return [1.0] * len(completions)

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("keyed", keyed, KeyedConfig)
"""


def test_the_judges_api_key_is_a_secret(registry):
    cfg = grpo_kit.compose(["+reward=judge", "reward.judge.api_key=sk-1"], registry)
    assert "reward.judge.api_key" in secret_paths(cfg)
    assert redacted(cfg)["reward"]["judge"]["api_key"] == REDACTED
    kept = ["reward.judge.api_key='${oc.env:OPENAI_API_KEY}'", "+reward.judge.api_key=sk-1", "seed=1"]
    assert redacted_overrides(kept, secret_paths(cfg)) == [kept[0], f"+reward.judge.api_key={REDACTED}", "seed=1"]


@pytest.mark.slow
def test_no_file_of_a_run_or_its_report_holds_a_secret(local_plugin, tiny_model, tmp_path, monkeypatch):
    module = local_plugin("keyed_reward", KEYED_REWARD)
    env = {
        **os.environ,
        "GRPO_KIT_PLUGINS": module,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "KEYED_TOKEN": FROM_ENV,
    }
    run_dir = tmp_path / "sweep" / "0"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "-m",  # a sweep of one run: Hydra's sweeper writes the command line into multirun.yaml too
            "+reward@reward.literal=keyed",
            "+reward@reward.from_env=keyed",
            f"reward.literal.token={LITERAL}",
            "reward.from_env.token=${oc.env:KEYED_TOKEN}",
            f"model.name_or_path={tiny_model}",
            "data.num_examples=16",
            "generation.num_generations=4",
            "trainer.per_device_train_batch_size=8",
            "trainer.max_steps=2",
            "trainer.save_steps=1",
            "trainer.progress_bar=false",
            "trainer.report_to=[tensorboard]",
            f"hydra.sweep.dir={run_dir.parent}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    assert commands.main(["report", str(tmp_path / "sweep")]) in (0, None)

    written = [path for path in tmp_path.rglob("*") if path.is_file() and "keyed_reward" not in path.name]
    assert any(path.name == "config.json" for path in written) and any(".hydra" in path.parts for path in written)
    assert any(path.name == "multirun.yaml" for path in written)
    assert any(path.name == "report.md" for path in written) and any("events" in path.name for path in written)
    for secret in (LITERAL, FROM_ENV):
        holding = [str(path.relative_to(tmp_path)) for path in written if secret.encode() in path.read_bytes()]
        assert holding == [], f"{secret} was written to {holding}"
        assert secret not in run.stdout + run.stderr
    recorded = (run_dir / ".hydra" / "overrides.yaml").read_text().replace("\\", "")  # a sweep's job escapes it
    assert "reward.from_env.token=${oc.env:KEYED_TOKEN}" in recorded
    command = resume_command(run_dir)
    assert "reward.from_env.token=" in command and "literal.token=" not in command
    assert "your reward.literal.token, which no file records" in command


def test_the_resume_command_keeps_an_interpolated_secret_and_asks_for_a_literal_one(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text(
        f"- +reward=judge\n- reward.judge.api_key={REDACTED}\n- seed=3\n"
    )
    command = resume_command(tmp_path)
    assert command.startswith("python -m grpo_kit +reward=judge seed=3 trainer.resume=auto")
    assert Path(str(tmp_path)).name in command and "your reward.judge.api_key" in command
