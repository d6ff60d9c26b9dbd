"""algorithm.forced_staleness = k: every generation batch is sampled, synchronously, by the weights of exactly k
optimizer steps earlier (min(step, k) at the first steps, where only the initial weights are older), whatever the
backend and its timing (docs/async.md, "Forced staleness").

`LaggedWeights` is a ring of the last k snapshots of the trainable parameters (a LoRA policy's adapters, or every
weight), one taken before each optimizer step. The served snapshot reaches the sampler two ways, so that every
backend samples from it:
- around the rollout (`serving`), it is copied into the policy's own parameters and the current ones are copied
  back after, exactly: the transformers backend, which samples with the live policy, samples from it, and its
  log-probs are its own;
- after each optimizer step (`push`), it is what `update_weights` sends a backend that holds weights of its own
  (vLLM, a merged LoRA copy); evaluation gets the current weights pushed first, and the lagged ones again after
  (`current_pushed`).
With k = 0 the ring is empty: the policy is served as it is, and the run is the run without forced staleness.
"""

import contextlib
from collections import deque

import torch

from grpo_kit.contract.distributed import weights_are_sharded
from grpo_kit.contract.errors import ConfigError


class LaggedWeights:
    """The last `lag` snapshots of `model`'s trainable parameters, oldest first, each with its weight version (the
    optimizer steps it had taken)."""

    def __init__(self, lag: int, model: torch.nn.Module):
        self.lag = lag
        self.model = model  # unwrapped: its parameters are those DDP or accelerate wrap
        self.snapshots: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=lag)

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        return {name: parameter for name, parameter in self.model.named_parameters() if parameter.requires_grad}

    def remember(self, version: int) -> None:
        """A snapshot of the weights of `version` steps, taken before the optimizer step that moves them. The oldest
        one leaves the ring: it served its last batch before this step's optimizer step."""
        if self.lag:
            self.snapshots.append((version, {name: p.detach().clone() for name, p in self.trainable().items()}))

    def served_version(self, version: int) -> int:
        """The weight version that samples while the current weights have taken `version` steps."""
        return self.snapshots[0][0] if self.snapshots else version

    @contextlib.contextmanager
    def serving(self, version: int):
        """Inside, the policy's trainable parameters are the served snapshot's; yields its version. The current
        parameters are copied back on the way out, whatever happened inside."""
        if not self.snapshots:  # k = 0, or no step taken yet: the weights as they are
            yield version
            return
        served, weights = self.snapshots[0]
        parameters = self.trainable()
        with torch.no_grad():
            current = {name: p.detach().clone() for name, p in parameters.items()}
            for name, parameter in parameters.items():
                parameter.copy_(weights[name])
        try:
            yield served
        finally:
            with torch.no_grad():
                for name, parameter in parameters.items():
                    parameter.copy_(current[name])

    def push(self, generation, model, version: int) -> None:
        """The backend's weights after an optimizer step: the served snapshot's, tagged with its version. `model`:
        the policy as the backend was started with it (prepared)."""
        with self.serving(version) as served:
            generation.update_weights(model, served)

    @contextlib.contextmanager
    def current_pushed(self, generation, model, version: int):
        """Inside, the backend holds the current weights (for evaluation); after, the served snapshot's again."""
        if not self.snapshots:  # it holds the current weights already
            yield
            return
        generation.update_weights(model, version)
        try:
            yield
        finally:
            self.push(generation, model, version)

    def state_dict(self) -> list[dict]:
        """The ring, on the CPU, for a checkpoint."""
        return [
            {"version": version, "weights": {name: tensor.cpu() for name, tensor in weights.items()}}
            for version, weights in self.snapshots
        ]

    def load_state_dict(self, state: list[dict]) -> None:
        devices = {name: parameter.device for name, parameter in self.trainable().items()}
        self.snapshots.clear()
        for snapshot in state:
            weights = {name: tensor.to(devices[name]) for name, tensor in snapshot["weights"].items()}
            self.snapshots.append((snapshot["version"], weights))


def push_weights(lagged: LaggedWeights | None, generation, model, version: int) -> None:
    """The backend's weights once the policy has taken `version` steps: the current ones, or the served snapshot's."""
    if lagged is None:
        generation.update_weights(model, version)
    else:
        lagged.push(generation, model, version)


def current_weights(lagged: LaggedWeights | None, generation, model, version: int):
    """A context in which the backend holds the current weights, for evaluation: it measures the policy being
    trained, not the older one that generates its batches."""
    return contextlib.nullcontext() if lagged is None else lagged.current_pushed(generation, model, version)


def lagged_weights(cfg, accelerator, model: torch.nn.Module) -> LaggedWeights | None:
    """The run's ring when algorithm.forced_staleness is set (`model` unwrapped), else None."""
    lag = cfg.algorithm.forced_staleness
    if lag is None:
        return None
    if weights_are_sharded(accelerator):
        raise ConfigError(
            f"algorithm.forced_staleness={lag} keeps whole copies of the trainable weights, which FSDP and DeepSpeed "
            "ZeRO-3 split between processes: train with DDP or ZeRO-1/2, or drop algorithm.forced_staleness."
        )
    return LaggedWeights(lag, model)
