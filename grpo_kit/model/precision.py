"""`trainer.mixed_precision=auto` (model=hf): TRL's bf16 where the GPU has it, float32 elsewhere."""

import logging

import torch

log = logging.getLogger(__name__)


def resolve_mixed_precision(requested: str) -> str:
    """accelerate's mixed_precision for `requested`; `auto` chooses for the device the run trains on (a CUDA GPU
    whenever there is one, as accelerate does) and logs what it chose and why."""
    if requested != "auto":
        return requested
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        log.info("trainer.mixed_precision=auto: bf16 (TRL's default) on %s", torch.cuda.get_device_name())
        return "bf16"
    # TRL's GRPOConfig() itself refuses bf16 without a bf16 GPU unless told use_cpu=True; float32 also keeps a CPU
    # run's numbers the same on every CPU, with or without native bf16 instructions.
    where = f"{torch.cuda.get_device_name()} has no bfloat16" if torch.cuda.is_available() else "no CUDA GPU"
    log.info(
        "trainer.mixed_precision=auto: no (float32), since %s; trainer.mixed_precision=bf16 autocasts to bfloat16 "
        "anyway (on a CPU too, as TRL's use_cpu=True does)",
        where,
    )
    return "no"


def use_tf32(enabled: bool | None) -> None:
    """trainer.tf32: TF32 for CUDA matmuls and cuDNN convolutions (Ampere GPUs and later), as transformers sets it;
    None leaves torch's defaults. A CPU computes in float32 whatever it says."""
    if enabled is None:
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    if enabled and not torch.cuda.is_available():
        log.info("trainer.tf32=true acts on CUDA GPUs only: this run computes in float32 on its device")
