"""How a trainer swaps the CPU test server's weights: vLLM's pause (`Gate`), which holds or refuses generation while
a sync runs, and the receiving end of vLLM's weight transfer (`WeightSync`), over gloo.

The routes' request rules are protocol.py's; the tensors land in the engine's model under its lock.
"""

import contextlib
import os
import signal
import threading
from http import HTTPStatus

import torch

from grpo_kit_vllm import transport
from grpo_kit_vllm.testing import protocol
from grpo_kit_vllm.testing.engine import Worker
from grpo_kit_vllm.testing.protocol import NOT_CONFIGURED, OutOfOrder, RequestError


class Gate:
    """vLLM's pause: while paused, new completions are refused (modes abort, wait) or held until resume (keep)."""

    def __init__(self):
        self.condition = threading.Condition()
        self.mode: str | None = None  # None: not paused
        self.in_flight = 0

    @contextlib.contextmanager
    def admit(self):
        with self.condition:
            while self.mode is not None:
                if self.mode != "keep":
                    raise RequestError(
                        "Generation is paused. Please retry after it resumes.", HTTPStatus.SERVICE_UNAVAILABLE
                    )
                self.condition.wait()
            self.in_flight += 1
        try:
            yield
        finally:
            with self.condition:
                self.in_flight -= 1
                self.condition.notify_all()

    def pause(self, mode: str) -> None:
        """Close the gate, then wait for the completions already admitted (vLLM would abort or freeze them)."""
        with self.condition:
            self.mode = mode
            self.condition.notify_all()  # requests held in keep mode look again: abort and wait refuse them
            self.condition.wait_for(lambda: self.in_flight == 0)

    def resume(self) -> None:
        with self.condition:
            self.mode = None
            self.condition.notify_all()


class WeightSync:
    """The receiving end of vLLM's weight transfer: the trainer's group and the update round in progress.

    `configured` false is a vLLM started without --weight-transfer-config: every route answers 500.
    `freeze_at_update` k > 0 makes the k-th /update_weights stop this whole process (SIGSTOP) before it receives a
    byte, its sockets open: a server that hangs mid-broadcast, as a dead GPU does, for the tests of the trainer's
    deadline (gloo would otherwise notice a closed socket where NCCL waits forever).
    """

    def __init__(self, worker: Worker, configured: bool = True, freeze_at_update: int = 0):
        self.worker = worker
        self.configured, self.freeze_at_update, self.updates = configured, freeze_at_update, 0
        self.lock = threading.Lock()  # taken before the worker's lock, never after
        self.group: transport.GlooGroup | None = None
        self.packed, self.buffer_bytes = False, transport.BUFFER_BYTES
        self.updating = False
        self.last_metas: list[transport.TensorMeta] = []  # what an update with empty metadata receives again

    def check_configured(self) -> None:
        if not self.configured:
            raise RequestError(NOT_CONFIGURED, HTTPStatus.INTERNAL_SERVER_ERROR)

    def init(self, body: dict, query: dict) -> dict:
        self.check_configured()
        info = protocol.init_info(body, transport.BUFFER_BYTES, transport.NUM_BUFFERS)
        with self.lock:
            if self.group is not None and self.group.trainer_alive():
                raise RequestError(
                    "This server's weight transfer belongs to another trainer, which still holds it: a server takes "
                    "the weights of one run. Start a server for this run, or stop the other first.",
                    HTTPStatus.CONFLICT,
                )
            self.close()
            # Blocks until the trainer, rank 0, has joined: it posts this request while opening its own end.
            self.group = transport.GlooGroup(
                info.master_address, info.master_port, rank=info.rank_offset, world_size=info.world_size
            )
            self.packed, self.buffer_bytes, self.last_metas = info.packed, info.packed_buffer_size_bytes, []
        return {"message": "Weight transfer initialized"}

    def start(self, body: dict, query: dict) -> dict:
        self.check_configured()
        with self.lock:
            if self.group is None:
                raise OutOfOrder("Weight transfer is not initialized: POST /init_weight_transfer_engine first.")
            if self.updating:
                raise OutOfOrder(
                    "start_weight_update called while a weight update is already active. "
                    "Call finish_weight_update first."
                )
            self.updating = True
        return {"message": "Weight update started"}

    def update(self, body: dict, query: dict) -> dict:
        self.check_configured()
        info = protocol.update_info(body)
        with self.lock:
            if self.group is None:
                raise OutOfOrder("Weight transfer is not initialized: POST /init_weight_transfer_engine first.")
            if not self.updating:
                raise OutOfOrder("start_weight_update must be called before update_weights.")
            try:
                metas = self._metas(info)
                if refused := self._refused(metas):
                    # vLLM's loader raises at the first such name and receives no further chunk, leaving the trainer
                    # broadcasting to no one; here none is received at all, so a trainer that waits without a
                    # deadline hangs in CI as it would on GPUs. The group is spent.
                    self.close()
                    self.worker.spent = True
                    raise RequestError(
                        "update_weights sent weights this model cannot take, so none was loaded: " + "; ".join(refused),
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                    )
                self.updates += 1
                if self.updates == self.freeze_at_update:
                    os.kill(os.getpid(), signal.SIGSTOP)
                with self.worker.lock:
                    for chunk in self._receive(metas):
                        self.worker.load(chunk)
            except BaseException:
                self.updating = False  # as vLLM's worker, a failed update ends the round
                raise
        return {"message": "Weights updated"}

    def finish(self, body: dict, query: dict) -> dict:
        self.check_configured()
        version = protocol.field(body, "weight_version", str)
        with self.lock:
            if not self.updating:
                raise OutOfOrder("finish_weight_update called without a matching start_weight_update.")
            self.updating = False
            if version is not None:  # vLLM keeps the last version when none is given
                with self.worker.lock:
                    self.worker.weight_version = version
        return {"message": "Weight update finished"}

    def shutdown(self, body: dict, query: dict) -> dict:
        with self.lock:
            if self.updating:
                raise RequestError("Cannot release a trainer connection during a weight update")
            self.close()
        return {"message": "Weight transfer shut down"}

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def expire_if_trainer_gone(self) -> bool:
        """End the transfer, and a round in progress, of a trainer that is gone; whether it did. An update that is
        receiving holds the lock: it fails by itself when its sender goes."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.group is None or self.group.trainer_alive():
                return False
            self.updating = False
            self.close()
            return True
        finally:
            self.lock.release()

    def _metas(self, info: dict) -> list[transport.TensorMeta]:
        """The tensors this round announces; empty lists: those of the round before, as vLLM allows."""
        names, dtype_names, shapes = protocol.update_lists(info)
        if not names:
            return self.last_metas
        for name, dtype_name, shape in zip(names, dtype_names, shapes):
            # Without a dtype and shape the received bytes cannot even be cut into tensors.
            if not isinstance(getattr(torch, str(dtype_name), None), torch.dtype):
                raise RequestError(f"{name}: unknown dtype {dtype_name!r}.", param="update_info")
            if not isinstance(shape, list) or not all(isinstance(size, int) and size >= 0 for size in shape):
                raise RequestError(f"{name}: shape {shape!r} is not a list of sizes.", param="update_info")
        self.last_metas = transport.metas_of(info)
        return self.last_metas

    def _refused(self, metas: list[transport.TensorMeta]) -> list[str]:
        targets = self.worker.targets
        refused = []
        for meta in metas:
            target = targets.get(meta.name)
            if target is None:
                refused.append(f"there is no module or parameter named {meta.name!r}")
            elif tuple(target.shape) != meta.shape:
                refused.append(f"{meta.name} has shape {list(meta.shape)}, the model's {list(target.shape)}")
        return refused

    def _receive(self, metas: list[transport.TensorMeta]):
        """The round's (name, tensor) pairs, a chunk at a time: packed as vLLM packs them, or one broadcast each."""
        if self.packed:
            yield from transport.receive(self.group, metas, buffer_bytes=self.buffer_bytes)
            return
        for meta in metas:
            tensor = torch.empty(meta.shape, dtype=meta.dtype)
            self.group.broadcast(tensor)
            yield [(meta.name, tensor)]
