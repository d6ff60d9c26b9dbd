"""`python -m grpo_kit OVERRIDES...`: a Hydra app that composes the run and trains it.

A run first claims its directory (grpo_kit/outputs/checkpoints.py): it locks it against other runs, and checks that a
resumed run's checkpoint is intact and was saved under the same settings. Until then nothing is written there, so
a refused run leaves a directory as it found it. Then the CLI writes what Hydra would (.hydra/config.yaml, hydra.yaml,
overrides.yaml), logs into RUN_DIR/cli.log, and trains; a run that fails from then on leaves error.txt with
its traceback. In a sweep a failed run is recorded and the next one starts clean; the sweep exits 1 once they are
done. The exit code says how a run ended: 0 finished, 1 failed or refused, 128 + N stopped (and saved) by signal N.

`--help` is answered here rather than by Hydra, whose help copies its whole config store once for each config
group: seconds, with every plugin's config stored.
"""

import contextlib
import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.types import RunMode
from omegaconf import OmegaConf

from grpo_kit.config.compose import (
    PRIMARY_CONFIG,
    check_rewards_chosen,
    complete,
    hydra_composition,
    note_default_loss,
    store_configs,
    with_presets,
)
from grpo_kit.config.overrides import check_a_reward_may_be_chosen, check_choices
from grpo_kit.config.presets import preset_choices
from grpo_kit.config.schema import DEFAULT_CHOICES
from grpo_kit.config.secrets import (
    literal_secrets,
    redact_logs,
    redact_sweep_record,
    redacted,
    redacted_hydra_record,
    secret_paths,
)
from grpo_kit.contract.errors import ConfigError, UserError
from grpo_kit.contract.kinds import KINDS
from grpo_kit.model.threads import wait_passively
from grpo_kit.plugins.registry import Registry

log = logging.getLogger("grpo_kit")
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"

HELP = """python -m grpo_kit OVERRIDES...: compose a run of plugins and presets, and train it (-m: a sweep of runs).

== Plugins: +KIND=NAME chooses one; a reward or a hook may be several, +reward=[a,b] ==
{plugins}
`grpo-kit plugins` says what each plugin does and lists its options: loss.epsilon=0.3, reward.accuracy.weight=2.

== Presets (conf/) ==
{presets}

== Config: override anything (trainer.max_steps=100) ==
{config}
Powered by Hydra (https://hydra.cc): --hydra-help shows its own flags (--cfg job, --multirun, ...)."""

# How a preset of each group in conf/ is chosen, in the order --help lists them. A group the run has no default for
# takes +GROUP=NAME, so a new group is listed (after these) without an entry here. Hydra's own groups (hydra/...)
# choose how a sweep runs, and only -m runs one.
PRESET_CHOICE = {
    "model": "model=NAME",
    "data": "data=NAME",
    "experiment": "+experiment=NAME",
    "sweep": "-m +sweep=NAME",
    "hydra/launcher": "-m hydra/launcher=NAME",
    "hydra/sweeper": "-m hydra/sweeper=NAME",
}


def main() -> None:
    wait_passively()  # before torch is imported, here or in a sweep's worker processes, which inherit it
    try:
        registry = Registry()
        overrides = [arg for arg in sys.argv[1:] if "=" in arg and not arg.startswith("-")]
        if secrets := literal_secrets(overrides, registry):
            redact_logs(secrets)
        check_choices(overrides, registry)
        if {"--help", "-h"} & set(sys.argv[1:]):
            print(help_text(overrides, registry))
            return
        # A run (not --cfg job, whose config needs no reward), and no --config-dir that may hold one.
        if not {arg for arg in sys.argv[1:] if arg.startswith("-")} - {"-m", "--multirun"}:
            check_a_reward_may_be_chosen(overrides, registry)
        for_hydra = with_presets(overrides)  # each override in its place (+loss= written loss=), then presets
        sys.argv = [dict(zip(overrides, for_hydra)).get(arg, arg) for arg in sys.argv] + for_hydra[len(overrides) :]
    except UserError as error:
        sys.exit(f"error: {error}")
    except OverrideParseException:
        pass  # Hydra reports a malformed override itself, with its position
    store_configs(registry)

    @hydra.main(version_base="1.3", config_path=None, config_name=PRIMARY_CONFIG)
    def run(cfg) -> float | None:
        """Train one run; return its final reward (the mean of the last tenth of logged steps) for sweepers."""
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
        composed = OmegaConf.to_yaml(OmegaConf.create(redacted(cfg, resolve=False)))
        secrets = secret_paths(cfg)
        if in_sweep:  # Hydra's sweeper wrote the command line into it before any run
            redact_sweep_record(Path(hydra_cfg.sweep.dir) / "multirun.yaml", secrets)
        try:
            cfg = complete(cfg, registry)
            check_rewards_chosen(cfg, registry)  # here, not when the rewards are built: before torch loads
        except UserError as error:  # settings that cannot run: a sweep records it in the run's own new folder
            if in_sweep:
                (run_dir / "error.txt").write_text(f"{type(error).__name__}: {error}\n")
            return refused(error, in_sweep)
        note_default_loss(cfg, hydra_cfg.overrides.task)
        # torch and transformers load only now that the config is valid: a refused run answers at once.
        from grpo_kit.outputs.checkpoints import claim_run_directory
        from grpo_kit.report import final_reward
        from grpo_kit.training.lifecycle import Stopped
        from grpo_kit.training.loop import train

        try:
            claim_run_directory(run_dir, cfg)
        except UserError as error:  # another run's folder, or a resume refused: it stays as it is
            return refused(error, in_sweep)
        write_hydra_files(run_dir, composed, secrets)
        with run_log(run_dir) as log_file:
            try:
                train(cfg, run_dir, registry)
            except Stopped as stopped:  # saved, to be resumed; a sweep stops too, as the signal asked
                log.warning("%s", stopped)
                sys.exit(stopped.exit_code)
            except Exception as error:
                failure = "".join(traceback.format_exception(error))
                write_error_file(run_dir, failure)
                log_file.write(failure)
                if in_sweep:  # one failed run is recorded and the others go on
                    log.error("This run failed (see %s): %s", run_dir / "error.txt", error)
                    return None
                if isinstance(error, UserError):
                    log.error("%s", error)
                    sys.exit(1)
                log.error("The run failed; its traceback is in %s", run_dir / "error.txt")
                raise
        return final_reward(run_dir)

    run()
    exit_if_runs_failed()


def exit_if_runs_failed() -> None:
    """After a sweep whose other runs went on and finished: exit 1, naming the runs that failed."""
    from grpo_kit.report.callback import FAILED_RUNS

    if FAILED_RUNS:
        sys.exit(
            f"error: {len(FAILED_RUNS)} run(s) of the sweep failed; each one's error.txt says why:\n  "
            + "\n  ".join(str(folder / "error.txt") for folder in FAILED_RUNS)
        )


def help_text(overrides: list[str], registry: Registry) -> str:
    """The plugins and presets to choose from, and the config that `overrides` compose."""
    plugins = {f"+{kind}=NAME": _marked_default(registry.names(kind), DEFAULT_CHOICES.get(kind)) for kind in KINDS}
    choices = preset_choices()
    groups = [group for group in PRESET_CHOICE if group in choices] + sorted(set(choices) - set(PRESET_CHOICE))
    presets = {PRESET_CHOICE.get(group, f"+{group}=NAME"): ", ".join(choices[group]) for group in groups}
    try:
        config = OmegaConf.to_yaml(hydra_composition(overrides, registry))
    except ConfigCompositionException as error:  # what Hydra would print: its message and the cause
        raise ConfigError(f"{error}\n{error.__cause__ or ''}".strip()) from None
    return HELP.format(plugins=_columns(plugins), presets=_columns(presets), config=config)


def _marked_default(names: list[str], default: str | None) -> str:
    return ", ".join(f"{name} (default)" if name == default else name for name in names) or "(none installed)"


def _columns(rows: dict[str, str]) -> str:
    width = max(map(len, rows), default=0)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in rows.items())


def refused(error: UserError, in_sweep: bool) -> None:
    if not in_sweep:
        log.error("%s", error)
        sys.exit(1)
    log.error("This run was refused: %s", error)


def write_hydra_files(run_dir: Path, composed: str, secrets: set[str]) -> None:
    """What Hydra writes into .hydra/ before a run, written once the run has claimed its directory, with no secret
    option given literally on the command line (config/secrets.py)."""
    # As a container: a ListConfig of overrides would resolve '${oc.env:...}' into the secret itself.
    record = redacted_hydra_record(OmegaConf.to_container(HydraConfig.get(), resolve=False), secrets)
    folder = run_dir / ".hydra"
    folder.mkdir(exist_ok=True)
    (folder / "config.yaml").write_text(composed)
    OmegaConf.save(OmegaConf.create({"hydra": record}), folder / "hydra.yaml")
    OmegaConf.save(OmegaConf.create(record["overrides"]["task"]), folder / "overrides.yaml")


def write_error_file(run_dir: Path, failure: str) -> None:
    """RUN_DIR/error.txt. Where it cannot be written (a full disk, which may be what failed the run), the traceback
    goes to the console rather than being lost."""
    try:
        (run_dir / "error.txt").write_text(failure)
    except OSError as error:
        log.error("%s(error.txt could not be written: %s)", failure, error)


@contextlib.contextmanager
def run_log(run_dir: Path):
    """The whole run's log, warnings and tracebacks included, in RUN_DIR/cli.log as well as on the console, with
    library progress bars off and log lines printed above grpo_kit's own bar rather than through it.

    Yields the log file's stream, for a traceback that belongs in the file but not on the console.
    """
    import datasets
    import transformers
    from tqdm.contrib.logging import logging_redirect_tqdm

    root = logging.getLogger()
    file_handler = logging.FileHandler(run_dir / "cli.log")
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(file_handler)
    logging.captureWarnings(True)
    transformers.utils.logging.disable_default_handler()  # its records reach the root logger's handlers instead
    transformers.utils.logging.enable_propagation()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    try:
        with logging_redirect_tqdm():
            yield file_handler.stream
    finally:
        root.removeHandler(file_handler)
        file_handler.close()
