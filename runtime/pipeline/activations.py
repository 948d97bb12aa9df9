"""Peak activation memory of a pipeline rank: the saved tensors of all micro-batches in flight at once.

A pipeline schedule keeps several micro-batches' activations alive (GPipe all m of them, 1F1B at most
pp - stage, interleaved and V schedules their warm-up depth), so the peak is not one micro-batch's
saved bytes times anything fixed: it is measured. Every tensor autograd saves is wrapped in a holder
while it lives in the graph; a storage counts once however many saved views share it, from the first
save until the last holder is released (the backward that used it freed its graph). The peak of the
live sum over the step is this rank's activation memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class _Saved:
    __slots__ = ("tensor", "key", "tracker")

    def __init__(self, tensor: torch.Tensor, key: int | None, tracker: LiveActivations):
        self.tensor, self.key, self.tracker = tensor, key, tracker

    def __del__(self):
        if self.key is not None:
            self.tracker._release(self.key)


class LiveActivations:
    """Live saved bytes of the tensors autograd keeps, excluding parameters (and views of them)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.peak_bytes = 0
        self.live = 0
        self.storages: dict[int, list[int]] = {}  # storage pointer -> [bytes, holders]

    def _release(self, key: int) -> None:
        entry = self.storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self.storages[key]

    @contextmanager
    def counting(self) -> Iterator[None]:
        from torch.distributed.tensor import DTensor

        parameters = {
            (p.to_local() if isinstance(p, DTensor) else p).untyped_storage().data_ptr()
            for p in self.model.parameters()
        }

        def pack(tensor: torch.Tensor):
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            base = tensor._base if tensor._base is not None else tensor
            key = None
            if not isinstance(base, torch.nn.Parameter) and local.device.type != "meta":
                try:
                    storage = local.untyped_storage()
                    key, size = storage.data_ptr(), storage.nbytes()
                except (RuntimeError, NotImplementedError):
                    key, size = None, 0
                if key in parameters or not size:
                    key = None
                elif key in self.storages:
                    self.storages[key][1] += 1
                else:
                    self.storages[key] = [size, 1]
                    self.live += size
                    self.peak_bytes = max(self.peak_bytes, self.live)
            return _Saved(tensor, key, self)

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved.tensor):
            yield
