"""How the training processes are laid out: which one is the main one, and how they hold the policy, as a generation
backend needs to know it."""

import os


def is_main_process() -> bool:
    """Whether this is the main process of a launch, before the accelerator exists to say so: torchrun and
    accelerate launch set RANK in every process they start; a process started alone has none."""
    return os.environ.get("RANK", "0") == "0"


def weights_are_sharded(accelerator) -> bool:
    """Whether the weights themselves are split between processes (FSDP, DeepSpeed ZeRO-3): then whole weights must
    be gathered, a collective every process joins. Under DDP and ZeRO-1/2 every process holds them whole."""
    # Imported here: composing a run imports this module for is_main_process, and must not load torch with accelerate.
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.distributed_type == DistributedType.DEEPSPEED:
        return state.deepspeed_plugin.zero_stage == 3
    return state.distributed_type == DistributedType.FSDP
