"""How many threads torch computes with, and how they wait, so that runs sharing a machine share its cores.

torch's CPU kernels run on an OpenMP pool with a thread per core, whose idle threads spin, burning a core, before
they sleep. Alone on a machine that is what makes small kernels fast. With other work on the same cores, a
parallel sweep's other runs included, the spinning threads take the cores that the threads they wait for need:
with one other busy process on 2 cores, the embedded default ran 10 to 100 times slower (docs/training.md,
"Threads and busy machines"). So the threads wait passively, and each run takes its share of the cores. A sleeping
thread takes time to wake, which only a model with kernels big enough to split earns back: a small model computes
on one thread, which has nothing to wait for (benchmarks/README.md, "Threads").
"""

import os

from grpo_kit.contract.errors import ConfigError


def wait_passively() -> None:
    """OpenMP threads that sleep when idle instead of spinning. OpenMP reads this once, when torch is imported, so
    this must run before; a value the user set wins."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# Hidden sizes up to this one compute as fast on one thread as on two passively waiting ones, or within a tenth.
SMALL_MODEL_WIDTH = 512


def use_torch_threads(option: int | None, model_config) -> int:
    """Set torch's thread count from `trainer.torch_threads` and the model's width, and return it."""
    import torch

    runs = concurrent_runs(sweep_launcher())
    width = model_config.get_text_config(decoder=True).hidden_size
    threads = chosen_threads(option, os.environ.get("OMP_NUM_THREADS"), usable_cores(), runs, width)
    torch.set_num_threads(threads)
    return threads


def chosen_threads(option: int | None, omp_num_threads: str | None, cores: int, runs: int, width: int) -> int:
    """The option; else OMP_NUM_THREADS, as the user (or a launcher: loky, torchrun) set it; else one thread for a
    small model, and this run's share of the cores it may use for a bigger one."""
    if option is not None:
        if option < 1:
            raise ConfigError(
                f"trainer.torch_threads={option} must be 1 or more, or null to share this machine's cores between "
                "the runs on it."
            )
        return option
    if omp_num_threads:
        return int(omp_num_threads)
    if width <= SMALL_MODEL_WIDTH:
        return 1
    return max(1, cores // runs)


def usable_cores() -> int:
    """The cores this process may run on (a container or `taskset` may allow fewer than the machine has)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def sweep_launcher() -> dict | None:
    """Hydra's launcher settings, when this run was started from the command line."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().launcher if HydraConfig.initialized() else None


def concurrent_runs(launcher: dict | None) -> int:
    """How many runs a sweep trains at once on this machine: the joblib launcher's n_jobs; 1 otherwise."""
    if launcher is None or "joblib" not in str(launcher.get("_target_")):
        return 1
    n_jobs = launcher.get("n_jobs") or 1
    return n_jobs if n_jobs > 0 else max(1, usable_cores() + 1 + n_jobs)  # as joblib counts: -1 is every core
