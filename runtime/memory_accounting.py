"""Measured activation memory: the bytes autograd saves for the backward, counted as they are saved.

`torch.autograd.graph.saved_tensors_hooks` sees every tensor a forward keeps for its backward
(including `ctx.save_for_backward` inside custom ops). Storages are counted once (views of one
buffer share it), so the sum is the activation memory one micro-batch holds when its forward ends.
On an accelerator the allocator's peak is the better number; on CPU this is the one there is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SavedActivations:
    """Saved bytes per micro-batch forward, excluding the storages of `model`'s parameters (a matmul
    saves its weight, or a view of it: that is not activation memory)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.peak_bytes = 0

    def _parameter_storages(self) -> set[int]:
        from torch.distributed.tensor import DTensor

        out = set()
        for p in self.model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            out.add(local.untyped_storage().data_ptr())
        return out

    @contextmanager
    def counting(self) -> Iterator[None]:
        from torch.distributed.tensor import DTensor
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        seen: set[int] = self._parameter_storages()
        total = 0

        def count(local: torch.Tensor) -> None:
            nonlocal total
            if is_traceable_wrapper_subclass(local):
                # A wrapper (the AsyncCollectiveTensor a functional collective returns, e.g. the sequence shard
                # a reduce-scatter hands the first decoder layer) has no storage of its own: its inner tensors
                # hold the bytes.
                names, _ = local.__tensor_flatten__()
                for name in names:
                    count(getattr(local, name))
                return
            try:
                storage = local.untyped_storage()
            except (RuntimeError, NotImplementedError):
                return  # a tensor without storage holds nothing of its own
            key = storage.data_ptr()
            if key not in seen and storage.nbytes():
                seen.add(key)
                total += storage.nbytes()

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            base = tensor._base if tensor._base is not None else tensor
            # A weight (or a view of it, like the transpose a matmul keeps) is not an activation; FSDP's
            # unsharded parameters exist only during the forward but are parameters all the same.
            if not isinstance(base, torch.nn.Parameter) and local.device.type != "meta":
                count(local)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield
        self.peak_bytes = max(self.peak_bytes, total)
