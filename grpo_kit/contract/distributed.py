"""How the training processes hold the policy, as a generation backend needs to know it."""

from accelerate.utils import DistributedType


def weights_are_sharded(accelerator) -> bool:
    """Whether the weights themselves are split between processes (FSDP, DeepSpeed ZeRO-3): then whole weights must
    be gathered, a collective every process joins. Under DDP and ZeRO-1/2 every process holds them whole."""
    state = accelerator.state
    if state.distributed_type == DistributedType.DEEPSPEED:
        return state.deepspeed_plugin.zero_stage == 3
    return state.distributed_type == DistributedType.FSDP
