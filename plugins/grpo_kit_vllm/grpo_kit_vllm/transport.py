"""How a round of weights travels from the trainer to the generator's workers: vLLM's packed broadcast.

vLLM's weight-transfer engine (vllm/distributed/weight_transfer/nccl_engine.py and packed_tensor.py) receives a
round as broadcasts from rank 0, the trainer, to ranks 1..W, its workers. Packed, the round's tensors are laid end
to end as bytes and cut into chunks: a chunk closes after the tensor that takes it past `buffer_bytes`. The
sender and the receivers cut the same chunks from the same names, dtypes and shapes, which `/update_weights`
announces before the bytes flow.

The broadcasts themselves go through a group, the seam between GPUs and CPUs:
- `NcclGroup` joins vLLM's workers through NCCL with a unique id minted here (vLLM's `nccl_unique_id_b64`
  rendezvous, meant for trainers that do not import vLLM), then matches vLLM's one-element warm-up all_reduce.
- `GlooGroup` carries the same broadcasts between CPU processes (the test server, grpo_kit_vllm.testing.server),
  meeting at a TCPStore that the trainer opens (vLLM's `master_address`/`master_port` rendezvous), listening on
  that address only.
"""

import base64
import datetime
import hashlib
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

BUFFER_BYTES = 1 << 30  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES: both ends must cut chunks at the same size
NUM_BUFFERS = 2  # vLLM's DEFAULT_PACKED_NUM_BUFFERS: how many chunks the receiver keeps in flight


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a round, as `/update_weights` announces it."""

    name: str
    dtype_name: str  # torch's name without "torch.": "float32", "bfloat16"
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype_name)

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> "TensorMeta":
        return cls(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def update_info(metas: list[TensorMeta]) -> dict:
    """The body of vLLM's `/update_weights` for these tensors (`update_info`)."""
    return {
        "names": [meta.name for meta in metas],
        "dtype_names": [meta.dtype_name for meta in metas],
        "shapes": [list(meta.shape) for meta in metas],
    }


def metas_of(update_info: dict) -> list[TensorMeta]:
    return [
        TensorMeta(name, dtype_name, tuple(shape))
        for name, dtype_name, shape in zip(update_info["names"], update_info["dtype_names"], update_info["shapes"])
    ]


def chunk_bounds(sizes: list[int], buffer_bytes: int) -> list[tuple[int, int]]:
    """[start, end) index ranges of the chunks, as vLLM's pack_tensors cuts them."""
    bounds, start, total = [], 0, 0
    for index, size in enumerate(sizes):
        total += size
        if total > buffer_bytes:
            bounds.append((start, index + 1))
            start, total = index + 1, 0
    if start < len(sizes):
        bounds.append((start, len(sizes)))
    return bounds


def send(group, tensors: list[torch.Tensor], device: torch.device | str, buffer_bytes: int = BUFFER_BYTES) -> None:
    """Broadcast `tensors`, packed, from rank 0; the receivers must have been told their metadata.

    Each chunk reaches `device` on its own, as vLLM's packed sender streams them: a model gathered whole on the
    CPU (FSDP, ZeRO-3) never sits on the GPU all at once, only about `buffer_bytes` of it.
    """
    sizes = [tensor.numel() * tensor.element_size() for tensor in tensors]
    for start, end in chunk_bounds(sizes, buffer_bytes):
        chunk = [tensor.detach().to(device).contiguous().view(-1).view(torch.uint8) for tensor in tensors[start:end]]
        group.broadcast(torch.cat(chunk))
        del chunk  # before the next chunk reaches the device


def receive(
    group, metas: list[TensorMeta], device: torch.device | str = "cpu", buffer_bytes: int = BUFFER_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The tensors a rank-0 `send` of `metas` broadcasts, one chunk at a time, as (name, tensor) views of it."""
    for start, end in chunk_bounds([meta.nbytes for meta in metas], buffer_bytes):
        chunk_metas = metas[start:end]
        packed = torch.empty(sum(meta.nbytes for meta in chunk_metas), dtype=torch.uint8, device=device)
        group.broadcast(packed)
        pieces = packed.split([meta.nbytes for meta in chunk_metas])
        yield [(meta.name, _as_tensor(piece, meta)) for meta, piece in zip(chunk_metas, pieces)]


def _as_tensor(piece: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    if piece.storage_offset() % meta.dtype.itemsize:  # after an odd-sized tensor: a view would be misaligned
        piece = piece.clone()
    return piece.view(meta.dtype).view(meta.shape)


def digest(tensor: torch.Tensor) -> str:
    """vLLM's weight checksum (`/weight_checker`): the SHA-256 of the tensor's bytes."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()).hexdigest()


def digests(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    return {name: digest(tensor) for name, tensor in named_tensors}


class GlooGroup:
    """Broadcasts between CPU processes over gloo, outside any default process group a trainer may have."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, timeout: float = 300.0):
        timeout = datetime.timedelta(seconds=timeout)
        # Rank 0 listens; everyone returns once all have joined, so the ranks must start concurrently.
        self.store = None  # a receiver's connection to the trainer's store, which lives as long as the trainer's group
        if rank == 0:
            self.group = listening_group(master_address, master_port, world_size, timeout)
        else:
            self.store = torch.distributed.TCPStore(master_address, master_port, world_size, False, timeout=timeout)
            self.group = torch.distributed.ProcessGroupGloo(self.store, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        options = torch.distributed.BroadcastOptions()
        options.rootRank = src
        self.group.broadcast([tensor], options).wait()

    def trainer_alive(self) -> bool:
        """On a receiver: whether rank 0 still holds the group. Its store closes with its group, or with its process
        however that ends (a crash, SIGKILL), and a request to a closed store fails at once."""
        try:
            self.store.check(["trainer"])
        except torch.distributed.DistNetworkError:
            return False
        return True

    def close(self) -> None:
        self.group = self.store = None


def listening_group(address: str, port: int, world_size: int, timeout: datetime.timedelta):
    """Rank 0's group, listening on `address` alone. Left to themselves, the TCPStore listens on every interface and
    gloo on the one the host name resolves to; and whoever joins the group receives the weights."""
    listener = socket.create_server((address, port))
    store = torch.distributed.TCPStore(
        address,
        port,
        world_size,
        True,
        timeout=timeout,
        master_listen_fd=listener.detach(),  # the store closes it
    )
    options = torch.distributed.ProcessGroupGloo._Options()
    options._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname=address)]
    options._timeout = timeout
    return torch.distributed.ProcessGroupGloo(store, 0, world_size, options)


class NcclGroup:
    """The trainer's end of vLLM's NCCL group, joined from a unique id this process mints (no vLLM import)."""

    def __init__(self, world_size: int, device: torch.device):
        self.world_size, self.device = world_size, device
        self.unique_id = torch.cuda.nccl.unique_id()
        self.comm = None

    @property
    def unique_id_b64(self) -> str:
        return base64.b64encode(self.unique_id).decode()  # standard base64: vLLM refuses the URL-safe kind

    def join(self) -> None:
        """Blocks until every worker has joined: call it while `/init_weight_transfer_engine` is in flight."""
        with torch.cuda.device(self.device):
            self.comm = torch.cuda.nccl.init_rank(self.world_size, self.unique_id, 0)
            # vLLM's communicator opens with a one-element all_reduce that every rank must match.
            torch.cuda.nccl.all_reduce([torch.zeros(1, device=self.device)], comms=[self.comm])

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        torch.cuda.nccl.broadcast([tensor], root=src, comms=[self.comm])
        torch.cuda.current_stream(self.device).synchronize()  # the caller may change the weights right after

    def close(self) -> None:
        self.comm = None
