"""The presets of conf/experiment, conf/sweep and conf/hydra compose into the runs they promise.

The launcher and sweeper presets need their Hydra plugins (`pip install grpo-kit[sweeps]`); without them those
tests are skipped. The slow tests run real (tiny) sweeps end to end and read their reports.
"""

import json
import subprocess
import sys
from pathlib import Path

import hydra
import pytest
import yaml
from omegaconf import OmegaConf

import grpo_kit
from grpo_kit.config.compose import PRIMARY_CONFIG, store_configs
from grpo_kit.config.presets import PRESETS_MODULE

CONF = Path(__file__).resolve().parents[1] / "conf"
PRESET_FOLDERS = ["experiment", "sweep", "sweep/losses", "hydra/launcher", "hydra/sweeper"]
LOSSES = {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"}
# Experiments that are a study's grid rather than a paper's recipe: they have no reference band.
NOT_PAPER_RECIPES = {"staleness_x_correction"}
REPORT_CALLBACK = "++hydra.callbacks.report._target_=grpo_kit.report.callback.ReportCallback"


def compose_with_hydra(overrides, registry):
    """The composed config with its `hydra` node, which holds the sweeper's and launcher's settings."""
    store_configs(registry)
    with hydra.initialize_config_module(PRESETS_MODULE, version_base="1.3"):
        return hydra.compose(PRIMARY_CONFIG, overrides=overrides, return_hydra_config=True)


PRESETS = [path for folder in PRESET_FOLDERS for path in sorted((CONF / folder).glob("*.yaml"))]


@pytest.mark.parametrize("path", PRESETS, ids=lambda path: str(path.relative_to(CONF)))
def test_every_preset_opens_with_its_command(path):
    lines = path.read_text().splitlines()
    if lines[0].startswith("# @package"):
        lines = lines[1:]  # Hydra reads the package header only at the very top, so the command comes second
    assert lines[0].startswith("# python -m grpo_kit "), f"{path} should open with the command that runs it"


def test_dapo_recipe(registry):
    cfg = grpo_kit.compose(["+experiment=dapo", "+reward=accuracy"], registry)
    assert cfg.loss.name == "dapo" and (cfg.loss.epsilon, cfg.loss.epsilon_high) == (0.2, 0.28)
    assert list(cfg.hook) == ["dynamic_sampling"]
    assert set(cfg.reward) == {"soft_overlong", "accuracy"}  # the recipe's shaping beside the task's reward
    assert cfg.reward.soft_overlong.soft_punish_cache == 1
    assert cfg.reward.soft_overlong.max_completion_len == cfg.generation.max_completion_length
    assert cfg.algorithm.mask_truncated_completions is True
    assert cfg.algorithm.steps_per_generation == 4  # else every ratio is 1 and clip-higher never acts


def test_dr_grpo_gspo_cispo_recipes(registry):
    dr_grpo = grpo_kit.compose(["+experiment=dr_grpo", "+reward=accuracy"], registry)
    assert (dr_grpo.loss.name, dr_grpo.advantage.name) == ("dr_grpo", "none")
    gspo = grpo_kit.compose(["+experiment=gspo", "+reward=accuracy"], registry)
    assert (gspo.loss.name, gspo.importance_sampling.name) == ("grpo", "sequence")
    assert (gspo.loss.epsilon, gspo.loss.epsilon_high, gspo.algorithm.steps_per_generation) == (3e-4, 4e-4, 4)
    cispo = grpo_kit.compose(["+experiment=cispo", "+reward=accuracy"], registry)
    assert (cispo.loss.name, cispo.loss.epsilon_high, cispo.importance_sampling.name) == ("cispo", 5.0, "token")


def test_sapo_vespo_luspo_recipes(registry):
    sapo = grpo_kit.compose(["+experiment=sapo", "+reward=accuracy"], registry)
    assert (sapo.loss.name, sapo.importance_sampling.name, sapo.algorithm.steps_per_generation) == ("sapo", "token", 4)
    assert (sapo.loss.temperature_pos, sapo.loss.temperature_neg) == (1.0, 1.05)
    vespo = grpo_kit.compose(["+experiment=vespo", "+reward=accuracy"], registry)
    assert (vespo.loss.name, vespo.importance_sampling.name, vespo.algorithm.steps_per_generation) == (
        "vespo",
        "token",
        4,
    )
    luspo = grpo_kit.compose(["+experiment=luspo", "+reward=accuracy"], registry)
    assert (luspo.loss.name, luspo.importance_sampling.name) == ("luspo", "sequence")
    assert (luspo.loss.epsilon, luspo.loss.epsilon_high, luspo.algorithm.steps_per_generation) == (3e-4, 4e-4, 4)


def test_every_recipe_has_a_band():
    """A recipe without a reference band would change what it does to learning unnoticed (tests/recipe_bands/)."""
    recipes = {path.stem for path in (CONF / "experiment").glob("*.yaml")} - NOT_PAPER_RECIPES
    bands = {path.stem for path in (Path(__file__).parent / "recipe_bands").glob("*.json")}
    assert recipes <= bands, f"recipes without a band: {sorted(recipes - bands)}; see tests/recipe_bands/regenerate.py"


def test_an_experiment_is_changed_without_plus(registry):
    cfg = grpo_kit.compose(["+experiment=dapo", "loss=grpo", "loss.epsilon_high=0.3", "+reward=accuracy"], registry)
    assert (cfg.loss.name, cfg.loss.epsilon_high) == ("grpo", 0.3)
    cfg = grpo_kit.compose(["+experiment=dapo", "~hook@hook.dynamic_sampling", "+reward=accuracy"], registry)
    assert not cfg.hook
    # `+loss=`, as users type it, replaces the experiment's loss too.
    assert grpo_kit.compose(["+experiment=dapo", "+loss=grpo"], registry).loss.name == "grpo"


def test_all_losses_sweeps_every_loss_at_its_papers_level(registry):
    cfg = compose_with_hydra(["+sweep=all_losses"], registry)
    params = cfg.hydra.sweeper.params
    axis = params["+sweep/losses"].split(",")
    assert set(axis) == LOSSES and len(axis) == len(LOSSES) and params.seed == "0,1"
    assert {path.stem for path in (CONF / "sweep" / "losses").glob("*.yaml")} == LOSSES
    for loss in axis:
        run = grpo_kit.compose(["+sweep=all_losses", f"+sweep/losses={loss}", "+reward=accuracy"], registry)
        level = registry.get("loss", loss).traits["importance_sampling_level"] or "token"
        assert (run.loss.name, run.importance_sampling.name) == (loss, level)


def test_every_run_of_is_levels_x_corrections_composes(registry):
    cfg = compose_with_hydra(["+sweep=is_levels_x_corrections"], registry)
    levels = cfg.hydra.sweeper.params.importance_sampling.split(",")
    corrections = cfg.hydra.sweeper.params.rollout_correction.split(",")
    assert len(levels) * len(corrections) == 10
    for level in levels:
        for correction in corrections:
            run = grpo_kit.compose(  # compose also checks the combination (grpo/compatibility.py)
                ["+sweep=is_levels_x_corrections", f"importance_sampling={level}", f"rollout_correction={correction}"],
                registry,
            )
            assert (run.loss.name, run.importance_sampling.name, run.rollout_correction.name) == (
                "grpo",
                level,
                correction,
            )
            assert run.algorithm.steps_per_generation == 4


def test_local_parallel_launcher(registry):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install grpo-kit[sweeps]")
    launcher = compose_with_hydra(["hydra/launcher=local_parallel"], registry).hydra.launcher
    assert launcher._target_.endswith("JoblibLauncher") and (launcher.n_jobs, launcher.backend) == (2, "loky")


def test_slurm_launcher(registry):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install grpo-kit[sweeps]")
    cfg = compose_with_hydra(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], registry)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["partition"], launcher["gpus_per_node"], launcher["tasks_per_node"]) == ("gpu", 1, 1)
    assert launcher["setup"] == ["export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"]


def test_optuna_sweeper_maximises_over_lr_and_clip(registry):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install grpo-kit[sweeps]")
    sweeper = compose_with_hydra(["hydra/sweeper=optuna_lr_clip"], registry).hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "maximize"
    assert set(sweeper.params) == {"trainer.learning_rate", "loss.epsilon_high"}
    assert sweeper.params["trainer.learning_rate"].startswith("tag(log")
    assert sweeper.max_failure_rate == 1.0


def test_the_report_callback_is_a_hydra_callback():
    from hydra.experimental.callback import Callback
    from hydra.utils import instantiate

    assert isinstance(instantiate({"_target_": REPORT_CALLBACK.split("=")[1]}), Callback)


# ---- real sweeps, a few steps each ---------------------------------------------------------------------------


def sweep(tmp_path, *overrides) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "grpo_kit",
        "-m",
        "+reward=accuracy",
        "trainer.max_steps=3",
        "trainer.save_model=false",
        "trainer.progress_bar=false",
        "trainer.sample_every=0",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        REPORT_CALLBACK,
        *overrides,
    ]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)


def run_sweep(tmp_path, *overrides):
    done = sweep(tmp_path, *overrides)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp_path / "sweep"


def read_rows(path):
    import csv

    with path.open() as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_a_sweep_ends_with_its_report(tmp_path):
    sweep = run_sweep(tmp_path, "+sweep=all_losses", "+sweep/losses=grpo,luspo", "seed=0")
    runs = read_rows(sweep / "runs.csv")
    assert [row["variant"] for row in runs] == ["+sweep/losses=grpo", "+sweep/losses=luspo"]
    assert all(row["status"] == "ok" and row["steps"] == "3" for row in runs)
    assert (sweep / "report.md").is_file()


@pytest.mark.slow
def test_a_sweep_in_worker_processes_with_a_failed_run_exits_1_once_the_others_are_done(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install grpo-kit[sweeps]")
    # Run 0 fails inside the trainer, at its model; run 1 trains the embedded model. (tests/test_cli.py: in-process)
    done = sweep(tmp_path, "hydra/launcher=local_parallel", f"model.name_or_path={tmp_path / 'missing'},null")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    error_file = tmp_path / "sweep" / "0" / "error.txt"
    assert f"1 run(s) of the sweep failed; each one's error.txt says why:\n  {error_file}" in done.stderr
    runs = read_rows(tmp_path / "sweep" / "runs.csv")
    assert [(row["status"], row["steps"]) for row in runs] == [("failed", "0"), ("ok", "3")]


@pytest.mark.slow
def test_a_failed_run_left_by_an_earlier_sweep_in_its_directory_is_not_this_sweeps(tmp_path):
    sweep(tmp_path, f"model.name_or_path={tmp_path / 'missing'}")  # leaves sweep/0/error.txt
    done = sweep(tmp_path, "hydra.sweep.subdir=again_${hydra.job.num}", "trainer.max_steps=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "sweep" / "0" / "error.txt").exists()
    assert (tmp_path / "sweep" / "again_0" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_two_runs_at_once(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="pip install grpo-kit[sweeps]")
    sweep = run_sweep(tmp_path, "hydra/launcher=local_parallel", "+loss=grpo,dapo", "trainer.reward_timeout=10")
    runs = read_rows(sweep / "runs.csv")
    assert [row["status"] for row in runs] == ["ok", "ok"]
    for number in ("0", "1"):
        lines = [json.loads(line) for line in (sweep / number / "metrics.jsonl").read_text().splitlines()]
        trained = [line for line in lines if "reward" in line]  # step 0 is an evaluation only
        # The accuracy reward runs in a process pool of the run, itself a joblib (loky) worker process.
        assert trained and all(line["rewards/accuracy/failures"] == 0.0 for line in trained), (
            "rewards failed inside a joblib worker: a process pool started there inherits loky's start method, "
            "which its processes cannot set up; grpo_kit/rollout/scoring.py must reset it before starting the pool"
        )


@pytest.mark.slow
def test_optuna_search_returns_the_final_reward(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install grpo-kit[sweeps]")
    sweep = run_sweep(tmp_path, "hydra/sweeper=optuna_lr_clip", "+loss=dapo", "hydra.sweeper.n_trials=2")
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    runs = read_rows(sweep / "runs.csv")
    assert len(runs) == 2 and set(result["best_params"]) == {"trainer.learning_rate", "loss.epsilon_high"}
    best = max(float(row["final_reward"]) for row in runs)
    assert result["best_value"] == pytest.approx(best, abs=1e-5)  # runs.csv keeps 6 digits
    assert "Optuna's best trial" in (sweep / "report.md").read_text()
