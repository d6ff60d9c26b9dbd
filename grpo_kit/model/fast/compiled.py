"""trainer.torch_compile: the policy's forward passes run through torch.compile (TRL's torch_compile).

Only the passes that score completions (model/logprobs.py `run_model`: the training pass, the old log-probs) are
compiled, not the model: generation, saving and the optimizer see the plain module, and no `_orig_mod.` enters a
state dict. One compiled function per (backend, mode) takes the model as an argument; dynamo keeps a graph per model
class and grad mode, and recompiles, with dynamic shapes from the second width on, where a pass's width changes.
"""

import functools
from dataclasses import replace

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.fast.switches import speed_ups_of, use_speed_ups


def use_compiled_passes(model, backend: str | None = None, mode: str | None = None) -> None:
    """`model`'s passes through torch.compile with `backend` (None: inductor) and `mode` from now on. A backend or
    mode that torch does not know is refused here, before the first pass."""
    options = (backend or "inductor", mode)
    try:
        _compiled(*options)
    except RuntimeError as error:  # dynamo's InvalidBackend, inductor's unknown mode
        raise ConfigError(
            f"trainer.torch_compile_backend={backend}, trainer.torch_compile_mode={mode}: torch.compile refuses "
            f"them ({error})."
        ) from None
    use_speed_ups(model, replace(speed_ups_of(model), torch_compile=options))


def compiled_call(options: tuple[str, str | None], model, inputs: dict[str, torch.Tensor], kwargs: dict):
    """`model(**inputs, **kwargs)` through torch.compile with `options`, (backend, mode)."""
    return _compiled(*options)(model, inputs, kwargs)


def _call(model, inputs: dict[str, torch.Tensor], kwargs: dict):
    return model(**inputs, **kwargs)


@functools.cache
def _compiled(backend: str, mode: str | None):
    return torch.compile(_call, backend=backend, mode=mode)
