"""The policy's weights as a generator loads them: the checkpoint's names, LoRA adapters folded in, each tensor once.

Parameters only, as TRL sends `named_parameters()`: a buffer (a persistent one is in `state_dict()`) is no weight
of vLLM's model, and its `load_weights` may refuse the name.
"""

from collections.abc import Iterator

import torch

from grpo_kit.contract.distributed import weights_are_sharded
from grpo_kit.contract.lora import has_adapters


def base_model_path(model: torch.nn.Module) -> str:
    """Where the weights a generator should start from were loaded: for a LoRA policy, its base model."""
    model = model.get_base_model() if has_adapters(model) else model
    return model.config._name_or_path


@torch.no_grad()
def named_weights(
    model: torch.nn.Module, accelerator, on_every_process: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights to send, on the main process; the others yield nothing, having joined any gather.

    Every process must call it: under FSDP and ZeRO-3 the whole weights are gathered from all of them. Where every
    process holds them whole anyway (DDP, ZeRO-1/2), `on_every_process` has each yield its own.
    """
    if weights_are_sharded(accelerator):
        state = accelerator.get_state_dict(model)  # a collective; the whole weights land on the main process
        if accelerator.is_main_process:
            parameters = parameter_names(accelerator.unwrap_model(model))
            yield from _once_each((name, tensor) for name, tensor in state.items() if name in parameters)
        return
    if not (accelerator.is_main_process or on_every_process):
        return
    unwrapped = accelerator.unwrap_model(model)
    if has_adapters(unwrapped):
        yield from merged_lora_weights(unwrapped)
    else:
        parameters = parameter_names(unwrapped)
        yield from _once_each((name, tensor) for name, tensor in unwrapped.state_dict().items() if name in parameters)


@torch.no_grad()
def merged_lora_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's weights with W + (alpha / r) B A wherever an adapter sits, under the base model's names.

    The policy itself is left alone (merging in place and unmerging would round its base weights differently
    every step).
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapted = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    parameters = parameter_names(base)
    for name, tensor in _once_each(base.state_dict().items()):
        if name not in parameters or any(part.startswith("lora_") for part in name.split(".")):
            continue
        module_name, separator, leaf = name.partition(".base_layer.")
        if not separator:
            yield name, tensor
            continue
        if leaf == "weight":
            module = adapted[module_name]
            tensor = tensor + sum(module.get_delta_weight(adapter) for adapter in module.active_adapters)
        yield f"{module_name}.{leaf}", tensor


def parameter_names(model: torch.nn.Module) -> set[str]:
    """Every name a parameter goes by, a tied one's second name too (`_once_each` keeps the first)."""
    return {name for name, _ in model.named_parameters(remove_duplicate=False)}


def _once_each(items) -> Iterator[tuple[str, torch.Tensor]]:
    """Tied weights (an output head sharing the embeddings) are one tensor under two names: send it once."""
    seen = set()
    for name, tensor in items:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        yield name, tensor
