"""What a piece of code asks of torch, counted below autograd and autocast: the CPU's proxies for a GPU's costs.

On a GPU, a read of a tensor's value on the host waits for every kernel queued before it, and a new input shape costs
new kernel plans (cuDNN's attention plans one per shape); neither shows in a CPU's timings, both show here.
"""

import contextlib
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that hand a tensor's value to the host (`.item()`, `bool(t)`, `torch.equal`), or whose output's size depends on
# values (`nonzero`, `masked_select`): each one a wait for the GPU on CUDA.
HOST_READS = frozenset(
    {
        "aten._local_scalar_dense.default",
        "aten.is_nonzero.default",
        "aten.equal.default",
        "aten.nonzero.default",
        "aten.masked_select.default",
        "aten.unique_consecutive.default",
        "aten._unique2.default",
    }
)
# Indexing ops whose output's size, with a boolean mask among the indices, depends on the mask's values: the op
# calls `nonzero` inside itself, where a dispatch mode does not see it.
MASK_INDEXING = frozenset({"aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"})
CASTS = frozenset({"aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.copy_.default"})


class DispatchCounter(TorchDispatchMode):
    """Counts every aten op run inside it (`ops`), the host reads among them (`host_reads`), and the casts of the
    `watched` tensors to another dtype (`watched_casts`): a parameter's cast to bf16 reads the parameter itself.

    Two host reads run no aten op of their own on a CPU and are counted apart (`ops["masked indexing"]`,
    `ops["tolist"]`): an index or index_put with a boolean mask, and `Tensor.tolist()` (a copy to the host on a GPU).
    """

    def __init__(self, watched=()):
        super().__init__()
        self.ops: Counter = Counter()
        self.watched = {tensor.data_ptr() for tensor in watched}
        self.watched_casts = 0

    @property
    def host_reads(self) -> int:
        reads = sum(count for name, count in self.ops.items() if name in HOST_READS)
        return reads + self.ops["masked indexing"] + self.ops["tolist"]

    def __enter__(self):
        self._own_tolist = vars(torch.Tensor).get("tolist")  # None: torch.Tensor inherits it from its C base
        inner = torch.Tensor.tolist

        def tolist(tensor, *args, **kwargs):
            self.ops["tolist"] += 1
            return inner(tensor, *args, **kwargs)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc_info):
        if self._own_tolist is None:
            del torch.Tensor.tolist
        else:
            torch.Tensor.tolist = self._own_tolist
        return super().__exit__(*exc_info)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.ops[name] += 1
        if name in MASK_INDEXING and _has_a_mask(args[1]):
            self.ops["masked indexing"] += 1
        out = func(*args, **kwargs)
        if name in CASTS and self.watched:
            source = args[1] if name == "aten.copy_.default" else args[0]
            if isinstance(source, torch.Tensor) and source.data_ptr() in self.watched:
                if isinstance(out, torch.Tensor) and out.dtype != source.dtype:
                    self.watched_casts += 1
        return out


def _has_a_mask(indices) -> bool:
    return any(isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) for index in indices)


@contextlib.contextmanager
def forward_input_shapes(module: torch.nn.Module):
    """Records the shapes of the tensors each call of `module` receives (positional and keyword, by name), one tuple
    per call, into the list it yields."""
    calls: list[tuple] = []

    def record(_, args, kwargs):
        shapes = [("", tuple(arg.shape)) for arg in args if isinstance(arg, torch.Tensor)]
        shapes += [(key, tuple(value.shape)) for key, value in kwargs.items() if isinstance(value, torch.Tensor)]
        calls.append(tuple(sorted(shapes)))

    hook = module.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        hook.remove()
