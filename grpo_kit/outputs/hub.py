"""Pushing a run to the Hugging Face Hub (`trainer.push_to_hub`, docs/hub.md), through huggingface_hub's own API.

`open_hub` checks that a token is at hand and creates the repo (and `hub_revision`'s branch) before the model is
loaded, so that a run that could never push is refused at once instead of after hours of training. Each push is
one commit of a folder prepared under RUN_DIR/.hub-uploads/: the model's files, a model card (README.md) and the
run's redacted config, and with `hub_strategy=checkpoint` the latest checkpoint as last-checkpoint/. A
checkpoint's files are hard links where the disk allows, so `save_total_limit` may delete the checkpoint while its
push is still under way.

Pushes of saves run in huggingface_hub's background thread (`run_as_future`), so training never waits on the
network; as in transformers, a save that comes while the previous push is still uploading is not pushed unless
`hub_always_push`. A failed push of a save is a warning and training goes on; the final push waits for the others
and a failure there is logged as an error naming the folder to push by hand. No push touches the run's own
checkpoints or model. The token is handed to each call and written nowhere.
"""

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from huggingface_hub import HfApi, ModelCardData, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError, OfflineModeIsEnabled
from omegaconf import DictConfig

from grpo_kit.contract.distributed import is_main_process
from grpo_kit.contract.errors import UserError
from grpo_kit.outputs.checkpoints import saved_checkpoints

log = logging.getLogger(__name__)

LAST_CHECKPOINT = "last-checkpoint"
UPLOADS = ".hub-uploads"  # RUN_DIR/.hub-uploads/NAME: what one push sends
CONFIG = "grpo_kit_config.yaml"  # the run's config.yaml (secrets redacted), as the pushed folder holds it
LOGIN = "log in with `hf auth login`, or set HF_TOKEN, or give trainer.hub_token"


class HubError(UserError):
    """The Hub cannot take this run's pushes: no login, a repo refused, the network down; the message says which."""


def open_hub(cfg: DictConfig, run_dir: Path) -> "HubPush | None":
    """The run's pushes to the Hub, its repo checked and created now; None unless `trainer.push_to_hub`, and on every
    process but the main one (which alone pushes)."""
    t = cfg.trainer
    if not t.push_to_hub or not is_main_process():
        return None
    api = HfApi(library_name="grpo_kit")
    name = t.hub_model_id or Path(run_dir).resolve().name  # transformers' default: the output folder's name
    try:
        # Said before any request, and not asked of /whoami-v2, which the Hub rate-limits strictly (a sweep's runs)
        if t.hub_token is None and get_token() is None:
            raise LocalTokenNotFoundError("no token")
        repo_id = api.create_repo(name, token=t.hub_token, private=t.hub_private_repo, exist_ok=True).repo_id
        if t.hub_revision is not None:
            api.create_branch(repo_id, branch=t.hub_revision, token=t.hub_token, exist_ok=True)
    except Exception as error:
        raise HubError(explained(error, name, api.endpoint)) from error
    log.info("Pushing to %s/%s (trainer.hub_strategy=%s)", api.endpoint, repo_id, t.hub_strategy)
    return HubPush(api, repo_id, cfg, Path(run_dir))


def explained(error: Exception, repo: str, endpoint: str) -> str:
    """What went wrong with the Hub, and what to do about it, in words."""
    if isinstance(error, LocalTokenNotFoundError):
        return f"trainer.push_to_hub needs a Hugging Face token, and none is set: {LOGIN}."
    if isinstance(error, OfflineModeIsEnabled):
        return "trainer.push_to_hub cannot push while HF_HUB_OFFLINE is set: unset it, or set push_to_hub=false."
    if isinstance(error, HFValidationError):
        return f"trainer.hub_model_id={repo!r} is not a valid repo name ({error})."
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        status = error.response.status_code
        if status == 401:
            return f"The Hub at {endpoint} refused the token (401 Unauthorized): {LOGIN} with a valid token."
        return (
            f"The Hub at {endpoint} refused repo {repo} ({status}: {error.server_message or error}): check that the "
            "token may write there (a write token, in your namespace or an organization you write to), or choose "
            "another trainer.hub_model_id."
        )
    if unreachable(error):
        return (
            f"The Hub at {endpoint} cannot be reached ({type(error).__name__}: {error}): check the network (and "
            "HF_ENDPOINT, if set), or set trainer.push_to_hub=false to train without pushing."
        )
    return f"Pushing to repo {repo} at {endpoint} failed: {type(error).__name__}: {error}"


def unreachable(error: Exception) -> bool:
    """A request that got no answer: a socket's error, or one of huggingface_hub's HTTP client (httpx2 in 2.x, httpx
    before), whose transport errors are found by name so as to depend on neither."""
    return isinstance(error, OSError) or any(kind.__name__ == "TransportError" for kind in type(error).__mro__)


class HubPush:
    """The pushes of one run to its repo, made by the main process."""

    def __init__(self, api: HfApi, repo_id: str, cfg: DictConfig, run_dir: Path):
        self.api, self.repo_id, self.run_dir, self.cfg, t = api, repo_id, run_dir, cfg, cfg.trainer
        self.token, self.revision = t.hub_token, t.hub_revision
        self.strategy, self.always_push = t.hub_strategy, t.hub_always_push
        self.pending: list[Future] = []
        shutil.rmtree(run_dir / UPLOADS, ignore_errors=True)  # what a run that stopped earlier left

    def uploading(self) -> bool:
        return any(not future.done() for future in self.pending)

    def push_save(self, step: int, write_model: Callable[[Path], None]) -> None:
        """The model `write_model` writes, with hub_strategy=checkpoint the newest checkpoint too, pushed in the
        background; not at all while the previous push is uploading, unless hub_always_push. The caller skips it
        under hub_strategy=end (grpo_kit/training/saving.py), before gathering the weights."""
        if not self.always_push and self.uploading():
            log.info(
                "Step %d is not pushed to the Hub: the previous push is still uploading "
                "(trainer.hub_always_push=true pushes every save).",
                step,
            )
            return
        folder = self.prepare(f"step-{step:06d}", write_model, final=False)
        future = self.upload(folder, f"Training in progress, step {step}", background=True)
        future.add_done_callback(lambda done: self.pushed_save(done, folder, step))
        self.pending.append(future)

    def pushed_save(self, future: Future, folder: Path, step: int) -> None:
        """Called in huggingface_hub's upload thread when a save's push ends, however it ends."""
        remove(folder)  # a copy: the run's own checkpoint is elsewhere, untouched
        if future.exception() is not None:
            log.warning(
                "The push of step %d to the Hub failed; training goes on, and the local checkpoint is intact. %s",
                step,
                explained(future.exception(), self.repo_id, self.api.endpoint),
            )
        else:
            log.info("Step %d pushed to %s", step, future.result().commit_url)

    def push_final(self, model: Path) -> None:
        """The final model (with hub_strategy=checkpoint the newest checkpoint too), pushed once the pushes under
        way have ended; a failure is logged, with the folder to push by hand."""
        self.wait()
        folder = self.prepare("final", lambda into: link_tree(model, into, exist_ok=True), final=True)
        try:
            commit = self.upload(folder, "End of training", background=False)
        except Exception as error:
            log.error(
                "The final push to the Hub failed: %s\nThe trained model is safe in %s; to push it by hand:\n"
                "  hf upload %s %s .%s",
                explained(error, self.repo_id, self.api.endpoint),
                model,
                self.repo_id,
                folder,
                f" --revision {self.revision}" if self.revision else "",
            )
            return
        remove(folder)
        log.info("Model pushed to %s", commit.commit_url)

    def prepare(self, name: str, write_model: Callable[[Path], None], final: bool) -> Path:
        """RUN_DIR/.hub-uploads/NAME: the model, its card and the run's config, and the checkpoint where the
        strategy pushes one."""
        folder = self.run_dir / UPLOADS / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        write_model(folder)
        (folder / "README.md").write_text(model_card(self.cfg, self.run_dir, self.repo_id, final))
        if (self.run_dir / "config.yaml").is_file():
            shutil.copy2(self.run_dir / "config.yaml", folder / CONFIG)
        checkpoints = saved_checkpoints(self.run_dir)
        if self.strategy == "checkpoint" and checkpoints:
            link_tree(checkpoints[-1], folder / LAST_CHECKPOINT)
        return folder

    def upload(self, folder: Path, message: str, background: bool):
        """One commit of `folder` to the repo: a Future of it in the background, else the commit itself."""
        return self.api.upload_folder(
            repo_id=self.repo_id,
            folder_path=folder,
            commit_message=message,
            token=self.token,
            revision=self.revision,
            run_as_future=background,
        )

    def wait(self) -> None:
        """Until every push under way has ended (each says itself how it ended)."""
        if self.uploading():
            log.info("Waiting for the push to the Hub under way to finish")
        for future in self.pending:
            future.exception()  # waits; pushed_save has reported it
        self.pending.clear()

    def close(self) -> None:
        self.wait()


def remove(folder: Path) -> None:
    """A pushed folder, and RUN_DIR/.hub-uploads once it holds no other."""
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        folder.parent.rmdir()


def link_tree(source: Path, target: Path, exist_ok: bool = False) -> None:
    """A copy of `source` at `target`, of hard links where the file system allows them: nothing is copied, and the
    copy outlives the deletion of the original (checkpoints are written once and never changed in place)."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link, dirs_exist_ok=exist_ok)


def model_card(cfg: DictConfig, run_dir: Path, repo_id: str, final: bool) -> str:
    """README.md of the pushed model: YAML metadata for the Hub, then what was trained, how, on what, and the last
    logged metrics."""
    base, data = cfg.model.name_or_path, cfg.data.path
    metadata = ModelCardData(
        library_name="grpo_kit",
        base_model=base if on_hub(base) else None,
        datasets=[data] if on_hub(data) else None,
        tags=["grpo_kit", "grpo", "reinforcement-learning"],
    )
    rewards = ", ".join(f"`{node.name}` (weight {node.weight:g})" for node in cfg.reward.values()) or "none"
    dataset = f"`{data}`" + (f" ({cfg.data.name})" if cfg.data.name else "") if data else "grpo_kit's embedded task"
    rows = [
        ("base model", f"`{base}`" if base else "grpo_kit's embedded tiny model (built from a seed)"),
        ("dataset", dataset),
        ("loss", f"`{cfg.loss.name}`"),
        ("advantage", f"`{cfg.advantage.name}`"),
        ("rewards", rewards),
        ("completions per prompt", str(cfg.generation.num_generations)),
    ]
    metrics = last_metrics(run_dir)
    step = metrics.pop("step", None)
    numbers = {name: value for name, value in metrics.items() if isinstance(value, (int, float))}
    at = f" (step {step})" if step is not None else ""
    lines = [
        f"---\n{metadata.to_yaml()}\n---",
        "",
        f"# {repo_id.split('/')[-1]}",
        "",
        "This model was trained by reinforcement learning with grpo_kit, a toolkit for GRPO-family methods whose "
        "losses, advantages and rewards are plugins. "
        + ("Training has finished." if final else f"Training is under way: this is the model as it was{at}."),
        "",
        "## How it was trained",
        "",
        "| | |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in rows),
        "",
        f"The run's whole configuration is in [{CONFIG}]({CONFIG}), secrets removed.",
        "",
        f"## {'Final metrics' if final else 'Metrics'}{at}",
        "",
        *(["| metric | value |", "|---|---|"] if numbers else ["No metrics were logged yet."]),
        *(f"| {name} | {value:.6g} |" for name, value in numbers.items()),
    ]
    return "\n".join(lines) + "\n"


def on_hub(name: str | None) -> bool:
    """Whether a model or dataset name is a Hub id, as the card's metadata may name it: a local path is not."""
    return name is not None and not Path(name).exists()


def last_metrics(run_dir: Path) -> dict:
    """The last line logged to RUN_DIR/metrics.jsonl, {} before any."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return json.loads(lines[-1]) if lines else {}
