"""`trex.optim.AdamW`: torch's fused AdamW with a training step that costs one kernel call, not a Python walk.

    import trex.optim
    optimizer = trex.optim.AdamW(compiled.parameters(), lr=1e-4, weight_decay=0.01)
    loss.backward(); optimizer.step(); optimizer.zero_grad()

Why: once trex has compiled the forward and backward, what is left of a small or medium model's training step
on a CPU is largely the optimizer's host work. `torch.optim.AdamW(fused=True)` runs one `_fused_adamw_` kernel,
but each `step()` first walks the parameters in Python (`_init_group`: the grad, the state dict, six list
appends per parameter), groups the lists by device and dtype again, and adds 1 to every parameter's own step
counter with `_foreach_add_`, which on CPU is a loop of one-element kernels. On tiny Qwen3-MoE (47 parameters,
one CPU thread) that is ~0.65 ms per step against ~0.28 ms in the kernel itself (bench/RESULTS.md, section 11,
"Twelfth session: the step"; `bench/optimizer_step.py` times the paths).

What this class changes, and what it keeps:
- The same update: it calls the same `torch._fused_adamw_` kernel with the same arguments, so parameters and
  states are bit-equal to `torch.optim.AdamW(fused=True)` (tests/compiler/test_optim.py).
- The same state layout: `state[p]` holds `step` (0-d float32 on the parameter's device), `exp_avg`,
  `exp_avg_sq` (and `max_exp_avg_sq` with amsgrad), as torch's fused AdamW keeps them, so `state_dict()` is
  loadable by `torch.optim.AdamW` and the other way round; LR schedulers, step hooks and `add_param_group`
  work as on any `torch.optim.Optimizer` (it is a subclass of `torch.optim.AdamW`).
- Faster: the per-parameter lists of each param group are built once, per (device, dtype), and reused while
  the group and the state are the ones they were built from; every parameter's `step` is a 0-d view into one
  counter tensor per list, so the increment is one kernel. A step where every parameter has a gradient costs a
  list comprehension over the gradients plus two kernels. A step where some parameters have no gradient
  updates only those (and only their counters), as torch does.
- Falls back to torch's own `step()` (same results, torch's speed) where AMP's `GradScaler` has set
  `grad_scale`/`found_inf` on the optimizer (they drive the kernel's scale and skip arguments).

The parameters must be floating-point tensors on a device torch's fused kernel supports (CPU, CUDA, MPS, XPU);
for anything else use `torch.optim.AdamW`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.optim.optimizer as _optimizer_module

__all__ = ["AdamW"]


@dataclass
class _Bucket:
    """The lists one `_fused_adamw_` call takes, for the parameters of one group on one device and dtype."""

    params: list[torch.Tensor]
    counters: torch.Tensor  # one float32 step counter per parameter; state[p]["step"] are views of it
    steps: list[torch.Tensor]
    exp_avgs: list[torch.Tensor | None]
    exp_avg_sqs: list[torch.Tensor | None]
    max_exp_avg_sqs: list[torch.Tensor | None]
    initialized: bool = False  # every parameter has its moment buffers


@dataclass
class _GroupPlan:
    """A param group's buckets, valid while the group holds the same params list and the optimizer the same state."""

    params_list: list[torch.Tensor]
    length: int
    state: Any
    buckets: list[_Bucket] = field(default_factory=list)


def _check_fused_kernel_takes(params: list[torch.Tensor]) -> None:
    """Refuse, at construction, parameters torch's fused AdamW kernel cannot update (torch finds out at step 1)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = _get_fused_kernels_supported_devices()
    for p in params:
        if not p.is_floating_point() or p.device.type not in devices:
            raise ValueError(
                "trex.optim.AdamW runs torch's fused AdamW kernel, which takes floating-point (not complex) "
                f"parameters on {', '.join(devices)}; got a {p.dtype} parameter of shape {tuple(p.shape)} on "
                f"{p.device}. Use torch.optim.AdamW for these parameters."
            )


class AdamW(torch.optim.AdamW):
    """AdamW (decoupled weight decay, Loshchilov & Hutter 2019) on torch's fused kernel, with an O(1)-Python step.

    Arguments as `torch.optim.AdamW`, less `foreach`/`fused`/`capturable`/`differentiable` (always the fused
    kernel, stepped from the host).
    See the module docstring for what is kept from torch's optimizer and why the step is faster.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float | torch.Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ):
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            fused=True,
        )
        self._plans: dict[int, _GroupPlan] = {}

    # -- the step -------------------------------------------------------------------------------------------

    def step(self, closure=None):
        """One AdamW update of every parameter that has a gradient; returns `closure()`'s loss if given.

        Step hooks and the profiler's `Optimizer.step#AdamW.step` range behave as on any torch optimizer; when
        there are none to run and no profiler records, the step skips torch's wrapper around `step` (its
        record_function range costs more than the rest of this method's Python).
        """
        if (
            _optimizer_module._global_optimizer_pre_hooks
            or _optimizer_module._global_optimizer_post_hooks
            or self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or torch._C._autograd._profiler_enabled()
        ):
            return self._hooked_step(closure)
        return self._step(closure)

    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        enabled = torch.is_grad_enabled()  # as torch.no_grad(), without making a context object every step
        torch._C._set_grad_enabled(False)
        try:
            self._update()
        finally:
            torch._C._set_grad_enabled(enabled)
        return loss

    def _update(self) -> None:
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None:
            super().step()  # AMP's GradScaler drives the kernel's scale/skip arguments: torch's own path
            return
        for index, group in enumerate(self.param_groups):
            plan = self._plans.get(index)
            params = group["params"]
            if (
                plan is None
                or plan.params_list is not params
                or plan.length != len(params)
                or plan.state is not self.state
            ):
                plan = self._plans[index] = self._plan_group(group)
            beta1, beta2 = group["betas"]
            arguments = dict(
                amsgrad=group["amsgrad"],
                lr=group["lr"],
                beta1=float(beta1),
                beta2=float(beta2),
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=group["maximize"],
            )
            for bucket in plan.buckets:
                self._step_bucket(bucket, group["amsgrad"], arguments)

    _hooked_step = torch.optim.Optimizer.profile_hook_step(_step)

    def _step_bucket(self, bucket: _Bucket, amsgrad: bool, arguments: dict[str, Any]) -> None:
        grads = [p.grad for p in bucket.params]
        if bucket.initialized and all(g is not None and g.layout is torch.strided for g in grads):
            bucket.counters.add_(1)
            torch._fused_adamw_(
                bucket.params,
                grads,
                bucket.exp_avgs,
                bucket.exp_avg_sqs,
                bucket.max_exp_avg_sqs if amsgrad else [],
                bucket.steps,
                **arguments,
            )
            return
        chosen = [i for i, g in enumerate(grads) if g is not None]
        if not chosen:
            return
        if any(grads[i].is_sparse for i in chosen):
            raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
        for i in chosen:
            if bucket.exp_avgs[i] is None:
                self._init_moments(bucket, i, amsgrad)
        bucket.initialized = all(m is not None for m in bucket.exp_avgs)
        steps = [bucket.steps[i] for i in chosen]
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(
            [bucket.params[i] for i in chosen],
            [grads[i] for i in chosen],
            [bucket.exp_avgs[i] for i in chosen],
            [bucket.exp_avg_sqs[i] for i in chosen],
            [bucket.max_exp_avg_sqs[i] for i in chosen] if amsgrad else [],
            steps,
            **arguments,
        )

    # -- the cached lists -----------------------------------------------------------------------------------

    def _plan_group(self, group: dict[str, Any]) -> _GroupPlan:
        """Buckets of `group` by (device, dtype); each parameter's step counter moved into its bucket's tensor."""
        by_key: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in group["params"]:
            by_key.setdefault((p.device, p.dtype), []).append(p)
        plan = _GroupPlan(params_list=group["params"], length=len(group["params"]), state=self.state)
        for (device, _), params in by_key.items():
            counters = torch.zeros(len(params), dtype=torch.float32, device=device)
            bucket = _Bucket(
                params=params,
                counters=counters,
                steps=[counters[i] for i in range(len(params))],
                exp_avgs=[None] * len(params),
                exp_avg_sqs=[None] * len(params),
                max_exp_avg_sqs=[None] * len(params),
            )
            for i, p in enumerate(params):
                state = self.state.get(p)
                if state:  # loaded or made by an earlier plan: keep its values, count in the bucket's tensor
                    counters[i] = state["step"]
                    state["step"] = bucket.steps[i]
                    self._attach_moments(bucket, i, state, group["amsgrad"])
            bucket.initialized = all(m is not None for m in bucket.exp_avgs)
            plan.buckets.append(bucket)
        return plan

    def _init_moments(self, bucket: _Bucket, i: int, amsgrad: bool) -> None:
        p = bucket.params[i]
        state = self.state[p]
        state["step"] = bucket.steps[i]
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if amsgrad:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self._attach_moments(bucket, i, state, amsgrad)

    @staticmethod
    def _attach_moments(bucket: _Bucket, i: int, state: dict[str, torch.Tensor], amsgrad: bool) -> None:
        bucket.exp_avgs[i] = state["exp_avg"]
        bucket.exp_avg_sqs[i] = state["exp_avg_sq"]
        if amsgrad:
            if "max_exp_avg_sq" not in state:  # a state saved without amsgrad, as torch's AdamW handles it
                state["max_exp_avg_sq"] = torch.zeros_like(bucket.params[i], memory_format=torch.preserve_format)
            bucket.max_exp_avg_sqs[i] = state["max_exp_avg_sq"]

    # -- what invalidates the cached lists ------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        _check_fused_kernel_takes(self.param_groups[-1]["params"])
        if hasattr(self, "_plans"):
            self._plans.clear()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._plans.clear()  # the loaded step counters are copied into fresh bucket tensors at the next step

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._plans = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As `torch.optim.Optimizer.zero_grad`; with `set_to_none` (the default) one loop without a profiler range."""
        if not set_to_none:
            super().zero_grad(set_to_none=False)
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


# torch's Optimizer.__init__ wraps a class's `step` in its hook/profiler wrapper unless it is marked hooked;
# AdamW.step runs that wrapper itself when there is something for it to do.
AdamW.step.hooked = True
