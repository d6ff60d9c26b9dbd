"""trainer.push_to_hub against a stand-in of the Hub's routes (grpo_kit/testing/hub.py): what a run pushes, its model
card, hub_strategy, the token kept out of every file, and the failures said clearly (no login, a repo refused, the
network down, an upload that fails mid-run)."""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest
import yaml
from huggingface_hub import constants
from huggingface_hub.errors import HFValidationError, OfflineModeIsEnabled
from safetensors.torch import load_file

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.outputs.hub import HubError, explained, model_card
from grpo_kit.testing import tiny_run
from grpo_kit.testing.hub import HubStandIn

TOKEN = "hf_standin_0123456789abcdef"  # a literal token, to be found in no file of the run
USER = "alice"
CONSTANT = "trainer.lr_scheduler_type=constant"  # a run that may be lengthened when it is resumed
PRIVATE = "trainer.hub_private_repo=true"


@pytest.fixture
def registry(digits_registry):
    return digits_registry


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A running stand-in that huggingface_hub talks to, with no login of the machine's in the way."""
    with HubStandIn(tokens={TOKEN: USER}) as server:
        point_at(monkeypatch, tmp_path, server.url)
        yield server


def point_at(monkeypatch, tmp_path, url: str) -> None:
    """huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and its token's path once, when it is imported."""
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-login" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-login" / "stored_tokens"))
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "no-login" / "agent_harnesses.json"))
    for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(variable, raising=False)


def pushing(tiny_model, *overrides: str) -> list[str]:
    return tiny_run(
        tiny_model,
        "+reward=digits",
        "trainer.max_steps=2",
        "trainer.save_steps=1",
        "trainer.push_to_hub=true",
        "trainer.hub_model_id=grpo-tiny",
        f"trainer.hub_token={TOKEN}",
        *overrides,
    )


def train(registry, overrides, run_dir):
    return grpo_kit.train(grpo_kit.compose(overrides, registry), run_dir, registry)


def test_a_run_pushes_its_model_and_a_model_card(hub, registry, tiny_model, tmp_path):
    run_dir = train(registry, pushing(tiny_model), tmp_path / "run")
    files = hub.files(f"{USER}/grpo-tiny")
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= set(files)
    pushed = tmp_path / "pushed.safetensors"
    pushed.write_bytes(files["model.safetensors"])
    local = load_file(run_dir / "model" / "model.safetensors")
    assert {name: tensor.tolist() for name, tensor in load_file(pushed).items()} == {
        name: tensor.tolist() for name, tensor in local.items()
    }, "the repo holds the final model"
    assert "last-checkpoint/state.pt" not in files  # every_save pushes models, not checkpoints
    card = files["README.md"].decode()
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata["library_name"] == "grpo_kit" and {"grpo_kit", "grpo"} <= set(metadata["tags"])
    assert "base_model" not in metadata  # a local folder, which no Hub page is
    assert "`dapo`" in card and "`group`" in card and "`digits` (weight 1)" in card and "embedded task" in card
    final = (run_dir / "metrics.jsonl").read_text().splitlines()[-1]
    reward = yaml.safe_load(final)["reward"]
    assert "Final metrics (step 2)" in card and f"| reward | {reward:.6g} |" in card
    assert hub.repos[f"{USER}/grpo-tiny"].commits[-1] == "End of training"
    assert not hub.repos[f"{USER}/grpo-tiny"].private, "hub_private_repo=null leaves it to the Hub (public)"
    assert not (run_dir / ".hub-uploads").exists(), "a pushed folder is removed once pushed"
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    holding = [str(path) for path in written if TOKEN.encode() in path.read_bytes()]
    assert holding == [] and any(path.name == "config.yaml" for path in written)
    assert all(TOKEN.encode() not in content for content in files.values())
    calls = [token for _, path, token in hub.requests if path != "/api/agent-harnesses"]  # telemetry, no login
    assert set(calls) == {TOKEN}, "every call carries the given token"


def test_the_checkpoint_strategy_pushes_the_latest_checkpoint(hub, registry, tiny_model, tmp_path):
    run_dir = train(
        registry,
        pushing(tiny_model, CONSTANT, "trainer.hub_strategy=checkpoint", "trainer.hub_revision=dev", PRIVATE),
        tmp_path / "run",
    )
    repo = hub.repos[f"{USER}/grpo-tiny"]
    assert repo.commits == ["Training in progress, step 1", "End of training"]  # step 2 is the end's push
    assert repo.private
    files = hub.files(f"{USER}/grpo-tiny", "dev")
    assert hub.files(f"{USER}/grpo-tiny", "main") == {}, "hub_revision's branch takes the pushes"
    checkpoint = run_dir / "checkpoints" / "step-000002"
    assert files["last-checkpoint/state.pt"] == (checkpoint / "state.pt").read_bytes()
    assert files["last-checkpoint/manifest.json"] == (checkpoint / "manifest.json").read_bytes()
    assert "model.safetensors" in files and "grpo_kit_config.yaml" in files
    downloaded = tmp_path / "downloaded"  # as `hf download --include 'last-checkpoint/*'` lays it out
    for name, content in files.items():
        if name.startswith("last-checkpoint/"):
            (downloaded / name).parent.mkdir(parents=True, exist_ok=True)
            (downloaded / name).write_bytes(content)
    resumed = [*pushing(tiny_model, CONSTANT, "trainer.max_steps=3"), f"trainer.resume={downloaded}/last-checkpoint"]
    resumed = [option for option in resumed if "hub" not in option]  # where it is pushed may change on resuming
    resumed_dir = train(registry, resumed, tmp_path / "resumed")
    steps = [json.loads(line)["step"] for line in (resumed_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3], "the pushed checkpoint resumes at step 3"


def test_the_end_strategy_pushes_once(hub, registry, tiny_model, tmp_path):
    train(registry, pushing(tiny_model, "trainer.hub_strategy=end"), tmp_path / "run")
    assert hub.repos[f"{USER}/grpo-tiny"].commits == ["End of training"]


def test_the_card_names_a_hub_model_and_dataset_in_its_metadata(registry, tmp_path):
    overrides = ["+reward=digits", "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct", "data.path=openai/gsm8k"]
    card = model_card(grpo_kit.compose([*overrides, "data.name=main"], registry), tmp_path, "me/qwen", final=False)
    metadata = yaml.safe_load(card.split("---\n")[1])
    assert metadata["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct" and metadata["datasets"] == ["openai/gsm8k"]
    assert "| dataset | `openai/gsm8k` (main) |" in card and "Training is under way" in card
    assert "No metrics were logged yet." in card


def test_offline_mode_and_a_bad_repo_name_are_said_in_words():
    offline = explained(OfflineModeIsEnabled("offline"), "me/model", "https://huggingface.co")
    assert "HF_HUB_OFFLINE is set" in offline and "push_to_hub=false" in offline
    bad = explained(HFValidationError("Repo id must use alphanumeric chars"), "me/a:b", "https://huggingface.co")
    assert "trainer.hub_model_id='me/a:b' is not a valid repo name" in bad


@pytest.mark.parametrize("strategy", ["all_checkpoints", "sometimes"])
def test_an_unknown_strategy_is_refused_by_name(registry, strategy):
    with pytest.raises(ConfigError, match="the accepted values are end .* every_save .* checkpoint") as refused:
        grpo_kit.compose(["+reward=digits", f"trainer.hub_strategy={strategy}"], registry)
    assert ("whole training state" in str(refused.value)) == (strategy == "all_checkpoints")


def test_a_push_without_a_final_model_is_refused(registry):
    with pytest.raises(ConfigError, match="trainer.save_model=false does not save"):
        grpo_kit.compose(["+reward=digits", "trainer.push_to_hub=true", "trainer.save_model=false"], registry)


def test_without_a_token_the_run_stops_before_training_and_says_how_to_log_in(hub, registry, tiny_model, tmp_path):
    overrides = [o for o in pushing(tiny_model) if not o.startswith("trainer.hub_token")]
    with pytest.raises(HubError, match="hf auth login.*HF_TOKEN.*trainer.hub_token"):
        train(registry, overrides, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and hub.requests == []


def test_a_refused_token_says_how_to_log_in(hub, registry, tiny_model, tmp_path):
    overrides = pushing(tiny_model, "trainer.hub_token=hf_wrong")
    with pytest.raises(HubError, match="refused the token .*hf auth login"):
        train(registry, overrides, tmp_path / "run")


def test_a_refused_repo_is_named_before_training(hub, registry, tiny_model, tmp_path):
    hub.refuse.add(f"{USER}/grpo-tiny")
    with pytest.raises(HubError, match="refused repo grpo-tiny \\(403: .*namespace") as refused:
        train(registry, pushing(tiny_model), tmp_path / "run")
    assert "trainer.hub_model_id" in str(refused.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    with pytest.raises(HubError, match="refused repo someone-else/grpo-tiny \\(403"):
        train(registry, pushing(tiny_model, "trainer.hub_model_id=someone-else/grpo-tiny"), tmp_path / "run2")


def test_the_network_down_is_said_before_training(monkeypatch, registry, tiny_model, tmp_path):
    with socket.socket() as closed:  # a port that nothing listens on once this is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    point_at(monkeypatch, tmp_path, f"http://127.0.0.1:{port}")
    with pytest.raises(HubError, match=f"127.0.0.1:{port} cannot be reached .*push_to_hub=false"):
        train(registry, pushing(tiny_model), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_push_that_fails_mid_run_is_a_warning_and_loses_nothing(hub, registry, tiny_model, tmp_path, caplog):
    hub.fail_commits_after, hub.fail_status = 1, 403  # a 5xx would be retried for 20 s first
    overrides = pushing(tiny_model, "trainer.max_steps=3", "trainer.hub_always_push=true", "trainer.save_total_limit=3")
    with caplog.at_level(logging.INFO, logger="grpo_kit.outputs.hub"):
        run_dir = train(registry, overrides, tmp_path / "run")
    assert hub.repos[f"{USER}/grpo-tiny"].commits == ["Training in progress, step 1"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("push of step 2 to the Hub failed; training goes on" in message for message in warnings)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "final push to the Hub failed" in errors[0] and "hf upload alice/grpo-tiny" in errors[0]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3, "training went on to the last step"
    assert [path.name for path in sorted((run_dir / "checkpoints").glob("step-*"))] == [
        "step-000001",
        "step-000002",
        "step-000003",
    ]
    assert (run_dir / "model" / "model.safetensors").is_file()
    kept = run_dir / ".hub-uploads" / "final"
    assert (kept / "model.safetensors").read_bytes() == (run_dir / "model" / "model.safetensors").read_bytes()


def test_a_push_under_way_makes_the_next_save_skip_and_outlives_its_checkpoint(
    hub, registry, tiny_model, tmp_path, caplog
):
    """Without hub_always_push, a save that comes while the previous push is uploading is not pushed; and the push of
    a checkpoint that save_total_limit deletes meanwhile still sends it whole."""
    release = hub.hold_uploads()  # until the final push waits for it: steps 2 and 3 are saved meanwhile

    class Release(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Waiting for the push"):
                release.set()

    logging.getLogger("grpo_kit.outputs.hub").addHandler(handler := Release())
    overrides = pushing(
        tiny_model, "trainer.max_steps=3", "trainer.save_total_limit=1", "trainer.hub_strategy=checkpoint"
    )
    try:
        with caplog.at_level(logging.INFO, logger="grpo_kit.outputs.hub"):
            run_dir = train(registry, overrides, tmp_path / "run")
    finally:
        logging.getLogger("grpo_kit.outputs.hub").removeHandler(handler)
    assert release.is_set() and not (run_dir / "checkpoints" / "step-000001").exists()
    assert hub.repos[f"{USER}/grpo-tiny"].commits == ["Training in progress, step 1", "End of training"]
    assert any("Step 2 is not pushed to the Hub" in r.getMessage() for r in caplog.records)
    hub_logs = [record for record in caplog.records if record.name == "grpo_kit.outputs.hub"]
    assert [record.getMessage() for record in hub_logs if record.levelno >= logging.WARNING] == []


@pytest.mark.slow
def test_a_token_given_on_the_command_line_is_in_no_file_or_log(tiny_model, tmp_path):
    """The whole command line's way, in a sweep of one run (whose launcher logs each run's overrides): Hydra's files,
    the run's log, the console, the checkpoints, what is pushed."""
    command = [option.replace("+reward=digits", "+reward=accuracy") for option in pushing(tiny_model)]
    with HubStandIn(tokens={TOKEN: USER}) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0"}
        env.pop("HF_TOKEN", None)
        run = subprocess.run(
            [sys.executable, "-m", "grpo_kit", "-m", *command, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        pushed = hub.files(f"{USER}/grpo-tiny")
    written = [path for path in (tmp_path / "sweep").rglob("*") if path.is_file()]
    assert any(".hydra" in path.parts for path in written) and any(path.suffix == ".log" for path in written)
    assert [str(path) for path in written if TOKEN.encode() in path.read_bytes()] == []
    assert TOKEN not in run.stdout + run.stderr
    assert "model.safetensors" in pushed and all(TOKEN.encode() not in content for content in pushed.values())
