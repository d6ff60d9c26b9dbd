"""Sharded training (FSDP2 and DeepSpeed ZeRO, through accelerate): what the training loop does differently when
the weights or the optimizer state are split between processes. Plain data parallelism needs none of it.

docs/scaling.md says how to launch each, and what was tested where.
"""

import copy

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, fsdp2_prepare_model
from omegaconf import DictConfig
from torch.distributed.fsdp import FSDPModule

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.lora import has_adapters
from grpo_kit.model.loading import load_model, load_reference_model, mix_into_reference

ACCELERATE_STATE = "accelerate"  # the checkpoint's folder of accelerator.save_state, under FSDP and DeepSpeed


def state_is_sharded(accelerator: Accelerator) -> bool:
    """Whether accelerate splits the weights or the optimizer state between processes (FSDP, DeepSpeed): then a
    checkpoint's model and optimizer are accelerate's own, each process writing and reading its part."""
    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def check_moving_reference(accelerator: Accelerator, cfg) -> None:
    """Under FSDP2, a reference model whose log-probs come from its hidden states (model.logits=chunked or liger)
    keeps its root's weights gathered after the pass, so algorithm.sync_ref_model could not mix the policy's shards
    into it: refused before the model is loaded."""
    if accelerator.is_fsdp2 and cfg.algorithm.sync_ref_model and cfg.model.logits != "full":
        raise ConfigError(
            f"algorithm.sync_ref_model=true under FSDP2 needs model.logits=full (got model.logits={cfg.model.logits}, "
            "which model=hf sets as TRL's chunked LM head): the reference's chunked pass leaves its root weights "
            "gathered, and they cannot be mixed with the policy's shards. Set model.logits=full, or "
            "algorithm.sync_ref_model=false."
        )


def zero_stage(accelerator: Accelerator) -> int | None:
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return None
    return accelerator.state.deepspeed_plugin.zero_stage


def configure_deepspeed(accelerator: Accelerator, t) -> None:
    """What DeepSpeed's config leaves to the training script ("auto"), from the trainer's settings: its micro-batch
    (accelerate would read it from a dataloader, and this loop has none) and the gradient clipping, which DeepSpeed
    applies inside its own optimizer step."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    if config.get("gradient_accumulation_steps", "auto") not in ("auto", 1):
        raise ConfigError(
            f"The DeepSpeed config sets gradient_accumulation_steps={config['gradient_accumulation_steps']}: set "
            'trainer.gradient_accumulation_steps instead, and leave DeepSpeed\'s "auto" (the losses divide by the '
            "accumulation steps themselves, as TRL's do; DeepSpeed would divide once more)."
        )
    config["gradient_accumulation_steps"] = 1
    for key, value in (
        ("train_micro_batch_size_per_gpu", t.per_device_train_batch_size),
        ("gradient_clipping", t.max_grad_norm),
    ):
        if config.get(key, "auto") == "auto":
            config[key] = value


def build_reference(cfg: DictConfig, policy: torch.nn.Module, accelerator: Accelerator):
    """The KL term's reference model, before accelerate prepares the policy."""
    if zero_stage(accelerator) == 3 and not has_adapters(policy):
        # ZeRO-3 loads the policy already split between processes (deepspeed.zero.Init): a copy would copy only this
        # process's pieces, so the reference is loaded again, split the same way.
        reference, _ = load_model(cfg.model)
        return reference.eval().requires_grad_(False)
    return load_reference_model(policy, accelerator.device)


def prepare_reference(reference, accelerator: Accelerator):
    """The frozen reference, sharded as the policy is. accelerate's `prepare` takes one model, with its optimizer,
    under FSDP2 and DeepSpeed, so the reference goes through accelerate's FSDP2 wrapping or DeepSpeed directly (as
    TRL does). A LoRA policy's reference is the policy itself, adapters off: nothing to prepare."""
    if reference is None or has_adapters(getattr(reference, "policy", reference)):
        return reference
    if accelerator.is_fsdp2:
        return fsdp2_prepare_model(accelerator, reference).eval()
    if zero_stage(accelerator) == 3:
        import deepspeed

        config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)  # filled in by the policy's prepare
        engine, *_ = deepspeed.initialize(model=reference, config=config)
        engine.eval()  # DeepSpeedEngine.eval returns None
        return engine
    return reference


def mix_into_sharded_reference(accelerator: Accelerator, model, reference, alpha: float) -> None:
    """algorithm.sync_ref_model's mixing of the policy into the reference, where FSDP2 or ZeRO-3 split both."""
    policy = accelerator.unwrap_model(model)
    if accelerator.is_fsdp2:  # split alike: each process mixes its own shards, once no layer is left gathered
        for module in (*policy.modules(), *reference.modules()):
            if isinstance(module, FSDPModule):
                module.reshard()
    if zero_stage(accelerator) == 3:  # gathered whole on every process; rank 0's result is split back
        import deepspeed

        with deepspeed.zero.GatheredParameters([*policy.parameters(), *reference.parameters()], modifier_rank=0):
            mix_into_reference(policy, reference, alpha)
    else:
        mix_into_reference(policy, reference, alpha)


def load_whole_weights(accelerator: Accelerator, model, weights: dict) -> None:
    """`model.load_state_dict(weights)` for a model that FSDP2 or ZeRO-3 may have split between processes."""
    if accelerator.is_fsdp2:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    elif zero_stage(accelerator) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
            accelerator.unwrap_model(model).load_state_dict(weights)
    else:
        model.load_state_dict(weights)
