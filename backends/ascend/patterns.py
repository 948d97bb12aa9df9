"""Pattern matching of canonicalized aten regions onto torch_npu fused operators.

Each pattern names the torch_npu operator (and so the schema) it targets, recognises its region
from an anchor node (the region's last node), and emits the fused call through `Emitter`, which
checks every call against torch_npu's shipped schema before it enters the graph. A rewrite replaces
the uses of the region's results with the fused op's outputs (cast back to the dtype each use had),
then dead-code elimination removes the region's nodes nobody else needs; nodes that other parts of
the graph still use (a value saved for the backward, say) stay, so the rewrite never changes what
the graph computes, only how.

Regions (forward and backward of training graphs after `passes.canonicalize.moe`):
  rms_norm           pow/mean/add/rsqrt/mul(/cast)/mul(weight)       -> npu_rms_norm
  swiglu             split in halves, silu(first) * second           -> npu_swiglu
  clipped_swiglu     silu(clamp(x1, max=L)) * clamp(x2, -L, L)       -> npu_clipped_swiglu (alpha=1, bias=0, halves)
  swiglu_backward    cat(silu_backward(g*up, gate), g*silu(gate))    -> npu_swiglu_backward
  rotary             x*cos + cat(-x2, x1)*sin  (4-D, "half")         -> npu_rotary_mul
  rotary_backward    g*cos + slice_backward halves of g*sin (4-D)   -> npu_rotary_mul_backward
  gating_topk        topk(softmax(logits, -1), k)                    -> npu_moe_gating_top_k_softmax
  moe_dispatch       trex.moe_dispatch                               -> npu_moe_init_routing_v2 (counts; > 10240
                                                 experts: npu_moe_token_permute + npu_moe_compute_expert_tokens)
  grouped_mm         trex.grouped_mm                                 -> npu_grouped_matmul (group_type=0)
  grouped_mm_wgrad   trex.grouped_mm_weight_grad                     -> npu_grouped_matmul (group_type=2, K split)
  moe_combine        trex.moe_combine                                -> npu_moe_token_unpermute
  moe_combine_bwd    trex.moe_combine_backward                       -> npu_moe_token_unpermute_grad
  moe_dispatch_bwd   trex.moe_dispatch_backward                      -> npu_moe_token_permute_grad_v2
"""

from __future__ import annotations

import abc
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

import trex.ops.moe  # noqa: F401 - the trex MoE ops the patterns anchor on
from trex.backends.ascend import emulation
from trex.backends.ascend.schemas import check_call

aten = torch.ops.aten
trex_ops = torch.ops.trex


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _dtype(node: Any) -> torch.dtype | None:
    value = _val(node)
    return value.dtype if isinstance(value, torch.Tensor) else None


def _last_dim(node: fx.Node, dim: Any) -> bool:
    value = _val(node)
    return isinstance(value, torch.Tensor) and isinstance(dim, int) and dim in (-1, value.dim() - 1)


def _getitems(node: fx.Node) -> dict[int, fx.Node]:
    return {user.args[1]: user for user in node.users if _is(user, operator.getitem)}


class Emitter:
    """Inserts schema-checked torch_npu calls (and aten glue) into a graph; records what it emitted."""

    def __init__(self, graph: fx.Graph, *, emulate: bool | None = None, check: Callable[..., Any] = check_call):
        self.graph = graph
        self.emulate = emulate
        self.check = check
        self.emitted: list[str] = []
        self.calls: list[fx.Node] = []  # the torch_npu calls emitted, in order (priced by their own formulas)
        self.glue: list[fx.Node] = []  # aten nodes emitted around the fused calls (casts, views, masks)
        self._casts: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}
        self._constants: list[fx.Node] = []
        self.replaced: dict[fx.Node, fx.Node] = {}  # region node -> the value now standing for it
        # group ends (cumulative, as trex's ops carry them) -> the per-expert counts they were summed from: a
        # grouped GEMM given those ends takes the counts (group_list_type=1) instead of a cast of the ends
        self.group_counts: dict[fx.Node, fx.Node] = {}
        self._widened: dict[fx.Node, fx.Node] = {}  # an integer cast to a wider type -> the value it widened

    def resolve(self, value: Any) -> Any:
        """Region nodes an earlier rewrite replaced, swapped for their replacements."""

        def one(node: fx.Node) -> fx.Node:
            while node in self.replaced:
                node = self.replaced[node]
            return node

        return torch.utils._pytree.tree_map_only(fx.Node, one, value)

    def replace(self, replacements: dict[fx.Node, fx.Node]) -> None:
        for old, new in replacements.items():
            old.replace_all_uses_with(new, propagate_meta=False)
            self.replaced[old] = new

    def npu(
        self,
        op_name: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        allowed: dict[str, Sequence[Any]] | None = None,
    ) -> fx.Node:
        args, kwargs = self.resolve((tuple(args), dict(kwargs or {})))
        self.check(op_name, args, kwargs, allowed=allowed)
        node = self._call(emulation.op(op_name, emulate=self.emulate), tuple(args), kwargs)
        node.meta["trex_npu_op"] = op_name
        self.emitted.append(op_name)
        self.calls.append(node)
        return node

    def _call(self, target: Any, args: tuple, kwargs: dict) -> fx.Node:
        args, kwargs = self.resolve((tuple(args), dict(kwargs)))
        node = self.graph.call_function(target, args, kwargs)
        node.meta["val"] = _fake_value(target, args, kwargs, self.graph)
        return node

    def aten(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        node = self._call(target, args, kwargs)
        self.glue.append(node)
        return node

    def constant(self, value: torch.Tensor, name: str) -> fx.Node:
        """A tensor constant of the lowered module (a buffer read by get_attr: no kernel at run time)."""

        module = self.graph.owning_module
        target = f"_trex_ascend_{name}_{len(self._constants)}"
        module.register_buffer(target, value, persistent=False)
        node = self.graph.get_attr(target)
        self._constants.append(node)
        fake_mode = _graph_fake_mode(self.graph)
        node.meta["val"] = fake_mode.from_tensor(value) if fake_mode is not None else value
        return node

    def item(self, node: fx.Node, index: int) -> fx.Node:
        return self._call(operator.getitem, (node, index), {})

    def cast(self, node: fx.Node, dtype: torch.dtype | None, like: torch.dtype | None = None) -> fx.Node:
        """`node` converted to `dtype` (no node when `like`, the value's known dtype, already is it, or when
        `node` is this emitter's exact widening of an integer value that already has `dtype`)."""
        if dtype is None or like == dtype:
            return node
        node = self.resolve(node)
        narrow = self._widened.get(node)
        if narrow is not None and _dtype(narrow) == dtype:
            return narrow
        key = (node, dtype)
        if key not in self._casts:  # one conversion per value and dtype (offsets feed several GEMMs)
            self._casts[key] = self.aten(aten._to_copy.default, node, dtype=dtype)
            source = _dtype(node)
            if _widens_exactly(source, dtype):
                self._widened[self._casts[key]] = node
        return self._casts[key]


_INTEGER_BITS = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}


def _widens_exactly(source: torch.dtype | None, target: torch.dtype) -> bool:
    """A signed integer cast to a wider signed integer: every value survives, so casting back is the identity."""
    return source in _INTEGER_BITS and target in _INTEGER_BITS and _INTEGER_BITS[target] > _INTEGER_BITS[source]


def _graph_fake_mode(graph: fx.Graph) -> Any:
    """The fake mode of the values already in `graph` (for nodes with no tensor inputs, e.g. zeros)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode([v for n in graph.nodes if isinstance(v := n.meta.get("val"), torch.Tensor)])


def _fake_value(target: Any, args: tuple, kwargs: dict, graph: fx.Graph | None = None) -> Any:
    """The FakeTensor value of a new node, computed in the fake mode of its inputs' values."""
    from torch._guards import detect_fake_mode

    values = torch.utils._pytree.tree_map_only(fx.Node, lambda n: n.meta.get("val"), (args, kwargs))
    if target is operator.getitem:
        return values[0][0][values[0][1]]
    fake_mode = detect_fake_mode(torch.utils._pytree.tree_leaves(values))
    if fake_mode is None and graph is not None:
        fake_mode = _graph_fake_mode(graph)
    if fake_mode is None:
        return None
    with fake_mode:
        return target(*values[0], **values[1])


@dataclass
class Match:
    """A region recognised by a pattern: its nodes and how to emit the fused replacement."""

    pattern: str
    op: str  # the torch_npu operator (schema) the region is lowered to
    nodes: list[fx.Node]
    emit: Callable[[Emitter], dict[fx.Node, fx.Node]]  # region node -> value replacing its uses
    extra_ops: list[str] = field(default_factory=list)


class Pattern(abc.ABC):
    """A region shape anchored at one of `anchors`, lowered to the torch_npu operator `op`."""

    name: str
    op: str
    anchors: tuple[Any, ...]

    @abc.abstractmethod
    def match(self, node: fx.Node) -> Match | None:
        """The region anchored at `node` when it has this pattern's shape, else None."""


# ---------------------------------------------------------------------------------------------


class RmsNorm(Pattern):
    """weight * (x * rsqrt(mean(x^2, -1, keepdim) + eps)) [with x upcast to fp32 and the product cast back]."""

    name, op = "rms_norm", "npu_rms_norm"
    anchors = (aten.mul.Tensor,)

    def match(self, node):
        for weight, normed in (node.args, node.args[::-1]):
            found = self._normalized(normed)
            if found is None or not isinstance(weight, fx.Node):
                continue
            x, upcast, rsqrt, eps, region = found
            w, xv = _val(weight), _val(x)
            if not (
                isinstance(w, torch.Tensor)
                and w.dim() == 1
                and w.size(0) == xv.size(-1)
                and w.dtype == xv.dtype == _dtype(node)
            ):
                continue
            if list(_val(node).shape) != list(xv.shape):
                continue

            if upcast is None and _dtype(x) == torch.float32:  # what RmsNormBackward may rely on (fp32 form)
                token = f"rms_norm {id(_val(rsqrt))}"
                normalized = next(n for n in region if _is(n, aten.mul.Tensor))
                for saved, role in ((x, "x"), (weight, "gamma"), (rsqrt, "rstd"), (normalized, "normed")):
                    _note_fact(saved, f"{token} {role}")
                for user in rsqrt.users:
                    if _is(user, aten.detach.default):
                        _note_fact(user, f"{token} rstd")

            def emit(e: Emitter, x=x, weight=weight, eps=eps, rsqrt=rsqrt):
                fused = e.npu("npu_rms_norm", (x, weight), {"epsilon": float(eps)})
                return {node: e.item(fused, 0), rsqrt: e.item(fused, 1)}

            return Match(self.name, self.op, [*region, node], emit)
        return None

    def _normalized(self, normed):
        cast = None
        if _is(normed, aten._to_copy.default) and set(normed.kwargs) <= {"dtype"}:
            cast, normed = normed, normed.args[0]
        if not _is(normed, aten.mul.Tensor):
            return None
        for x32, rsqrt in (normed.args, normed.args[::-1]):
            if not _is(rsqrt, aten.rsqrt.default) or not _is(rsqrt.args[0], aten.add.Tensor):
                continue
            add = rsqrt.args[0]
            mean, eps = add.args
            if not (_is(mean, aten.mean.dim) and isinstance(eps, (int, float))):
                continue
            dims = mean.args[1]
            keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
            power = mean.args[0]
            if not (
                keepdim
                and len(dims) == 1
                and _last_dim(power, dims[0])
                and _is(power, aten.pow.Tensor_Scalar)
                and power.args[0] is x32
                and power.args[1] == 2
            ):
                continue
            upcast, x = None, x32
            if _is(x32, aten._to_copy.default) and set(x32.kwargs) <= {"dtype"} and _dtype(x32) == torch.float32:
                upcast, x = x32, x32.args[0]
            if _dtype(x32) != torch.float32:
                continue
            if cast is not None and _dtype(cast) != _dtype(x):
                continue
            region = [n for n in (upcast, power, mean, add, rsqrt, normed, cast) if n is not None]
            return x, upcast, rsqrt, eps, region
        return None


def _halves(node: Any) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node] | None:
    """(x, split, first, second) when `node` is first/second half of x split in two along the last dim."""
    if not _is(node, operator.getitem):
        return None
    split = node.args[0]
    if not _is(split, aten.split.Tensor, aten.split_with_sizes.default):
        return None
    x = split.args[0]
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    size = _val(x).size(-1) if isinstance(_val(x), torch.Tensor) else None
    if size is None or size % 2 or not _last_dim(x, dim):
        return None
    sizes = split.args[1]
    if (isinstance(sizes, int) and sizes != size // 2) or (
        isinstance(sizes, (list, tuple)) and list(sizes) != [size // 2] * 2
    ):
        return None
    items = _getitems(split)
    if set(items) - {0, 1} or len(items) != 2:
        return None
    return x, split, items[0], items[1]


class SwiGlu(Pattern):
    """silu(x[..., :n]) * x[..., n:] with x split in halves along the last dim."""

    name, op = "swiglu", "npu_swiglu"
    anchors = (aten.mul.Tensor,)

    def match(self, node):
        for silu, up in (node.args, node.args[::-1]):
            if not _is(silu, aten.silu.default):
                continue
            halves = _halves(silu.args[0])
            if halves is None or halves[3] is not up or silu.args[0] is not halves[2]:
                continue
            x, split, gate, _ = halves
            if _dtype(x) != _dtype(node):
                continue

            def emit(e: Emitter, x=x):
                return {node: e.npu("npu_swiglu", (x,), {"dim": -1})}

            return Match(self.name, self.op, [split, gate, up, silu, node], emit)
        return None


def _clamp_bounds(node: Any) -> tuple[Any, Any, Any] | None:
    """(input, min, max) of an aten clamp (clamp / clamp_max / clamp_min), else None."""
    if _is(node, aten.clamp.default):
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        return node.args[0], low, high
    if _is(node, aten.clamp_max.default):
        return node.args[0], None, node.args[1]
    if _is(node, aten.clamp_min.default):
        return node.args[0], node.args[1], None
    return None


class ClippedSwiGlu(Pattern):
    """silu(clamp(x1, max=L)) * clamp(x2, -L, L) (DeepSeek-V4's swiglu_limit) with x split in halves."""

    name, op = "clipped_swiglu", "npu_clipped_swiglu"
    anchors = (aten.mul.Tensor,)

    def match(self, node):
        for silu, clamped_up in (node.args, node.args[::-1]):
            if not _is(silu, aten.silu.default):
                continue
            gate_bounds, up_bounds = _clamp_bounds(silu.args[0]), _clamp_bounds(clamped_up)
            if gate_bounds is None or up_bounds is None:
                continue
            gate, gate_low, limit = gate_bounds
            up, up_low, up_high = up_bounds
            if gate_low is not None or not isinstance(limit, (int, float)) or up_low != -limit or up_high != limit:
                continue
            halves = _halves(gate)
            if halves is None or halves[2] is not gate or halves[3] is not up:
                continue
            x, split, _, _ = halves
            if _dtype(x) != _dtype(node):
                continue

            def emit(e: Emitter, x=x, limit=float(limit)):
                out = e.npu(
                    "npu_clipped_swiglu",
                    (x,),
                    {"dim": -1, "alpha": 1.0, "limit": limit, "bias": 0.0, "interleaved": False},
                )
                return {node: out}

            return Match(self.name, self.op, [split, gate, up, silu.args[0], clamped_up, silu, node], emit)
        return None


class SwiGluBackward(Pattern):
    """cat([silu_backward(g * up, gate), g * silu(gate)], -1): the gradient of SwiGLU w.r.t. its input."""

    name, op = "swiglu_backward", "npu_swiglu_backward"
    anchors = (aten.cat.default,)

    def match(self, node):
        parts = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if len(parts) != 2 or not _last_dim(node, dim):
            return None
        grad_gate, grad_up = parts
        if not (
            _is(grad_gate, aten.silu_backward.default)
            and _is(grad_gate.args[0], aten.mul.Tensor)
            and _is(grad_up, aten.mul.Tensor)
        ):
            return None
        halves = _halves(grad_gate.args[1])
        if halves is None:
            return None
        x, split, gate, up = halves
        g_up = grad_gate.args[0]
        if up not in g_up.args:
            return None
        grad = g_up.args[1] if g_up.args[0] is up else g_up.args[0]
        silu = next((a for a in grad_up.args if _is(a, aten.silu.default) and a.args[0] is gate), None)
        if silu is None or grad not in grad_up.args or _dtype(node) != _dtype(x):
            return None

        def emit(e: Emitter, x=x, grad=grad):
            return {node: e.npu("npu_swiglu_backward", (grad, x), {"dim": -1})}

        return Match(self.name, self.op, [split, gate, up, g_up, grad_gate, silu, grad_up, node], emit)


class Rotary(Pattern):
    """x * cos + cat([-x2, x1], -1) * sin (rotate-half RoPE) on 4-D tensors."""

    name, op = "rotary", "npu_rotary_mul"
    anchors = (aten.add.Tensor,)

    def match(self, node):
        if len(node.args) != 2 or node.kwargs:
            return None
        for straight, rotated in (node.args, node.args[::-1]):
            if not (_is(straight, aten.mul.Tensor) and _is(rotated, aten.mul.Tensor)):
                continue
            for rot_cat, sin in (rotated.args, rotated.args[::-1]):
                if not _is(rot_cat, aten.cat.default):
                    continue
                found = self._rotate_half(rot_cat)
                if found is None:
                    continue
                x, region = found
                if x not in straight.args:
                    continue
                cos = straight.args[1] if straight.args[0] is x else straight.args[0]
                values = [_val(v) for v in (x, cos, sin, node)]
                if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in values):
                    continue
                same = list(values[3].shape) == list(values[0].shape) and values[0].dtype == values[3].dtype
                if not same:
                    continue

                def emit(e: Emitter, x=x, cos=cos, sin=sin):
                    out = e.npu("npu_rotary_mul", (x, cos, sin), {"rotary_mode": "half"})
                    return {node: e.cast(out, _dtype(node), _dtype(x))}

                return Match(self.name, self.op, [*region, straight, rotated, node], emit)
        return None

    def _rotate_half(self, cat):
        parts = cat.args[0]
        dim = cat.args[1] if len(cat.args) > 1 else 0
        if len(parts) != 2 or not _last_dim(cat, dim) or not _is(parts[0], aten.neg.default):
            return None
        second, first = parts[0].args[0], parts[1]
        if not (_is(second, aten.slice.Tensor) and _is(first, aten.slice.Tensor) and second.args[0] is first.args[0]):
            return None
        x = first.args[0]
        size = _val(x).size(-1)
        bounds = lambda s: (s.args[2] if len(s.args) > 2 else None, s.args[3] if len(s.args) > 3 else None)  # noqa: E731
        if not (_last_dim(x, first.args[1]) and _last_dim(x, second.args[1])):
            return None
        start1, end1 = bounds(first)
        start2, end2 = bounds(second)
        if not ((start1 in (0, None)) and end1 == size // 2 and start2 == size // 2 and (end2 is None or end2 >= size)):
            return None
        return x, [first, second, parts[0], cat]


class RotaryBackward(Pattern):
    """The gradient of rotate-half RoPE (x * cos + cat(-x2, x1) * sin) w.r.t. x, as autograd writes it:
        gs = g * sin
        dx = slice_backward(-gs[..., :h], at h) + slice_backward(gs[..., h:], at 0) + g * cos
    -> npu_rotary_mul_backward(g, self, cos, sin, "half")[0]. Its dx = g * r1 + rotate_half^T(g * r2)
    does not read `self` (only dr1 and dr2 do, and the tables need no gradient); the partitioned
    backward does not hold the forward's x (autograd saved only cos and sin), so `self` is given the
    incoming gradient, a tensor of x's shape and dtype, and the op's dr1, dr2 are not used."""

    name, op = "rotary_backward", "npu_rotary_mul_backward"
    anchors = (aten.add.Tensor,)

    def match(self, node):
        terms, adds = _sum_terms(node)
        if len(terms) != 3 or any(_is(t, aten.add.Tensor) for t in terms):
            return None
        straights = [t for t in terms if _is(t, aten.mul.Tensor)]
        backs = [t for t in terms if _is(t, aten.slice_backward.default)]
        if len(straights) != 1 or len(backs) != 2:
            return None
        for grad, sin, region in self._rotated_back(backs, node):
            found = self._fused(node, straights[0], grad, sin, region + adds)
            if found is not None:
                return found
        return None

    def _fused(self, node, straight, grad, sin, region):
        if grad not in straight.args:
            return None
        cos = straight.args[1] if straight.args[0] is grad else straight.args[0]
        values = [_val(v) for v in (grad, cos, sin, node)]
        if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in values):
            return None
        g, c, s, out = values
        if list(out.shape) != list(g.shape) or out.dtype != g.dtype or c.size(-1) != g.size(-1):
            return None
        if list(torch.broadcast_shapes(g.shape, c.shape, s.shape)) != list(g.shape):
            return None

        def emit(e: Emitter, grad=grad, cos=cos, sin=sin):
            grads = e.npu("npu_rotary_mul_backward", (grad, grad, cos, sin), {"rotary_mode": "half"})
            return {node: e.cast(e.item(grads, 0), _dtype(node), _dtype(grad))}

        return Match(self.name, self.op, [*region, straight, node], emit)

    def _rotated_back(self, backs, add):
        """[(g, sin, region)] when the two slice_backwards are rotate_half^T(g * sin), one per half."""
        parts = {}
        for part in backs:
            if not _is(part, aten.slice_backward.default):
                return []
            source, shape, dim, start, end, step = part.args
            if step != 1 or not _last_dim(part, dim) or list(shape) != list(_val(part).shape):
                return []
            parts[start] = (part, source, end)
        size = _val(add).size(-1)
        half = size // 2
        if size % 2 or set(parts) != {0, half}:
            return []
        to_first, taken_second, end_first = parts[0]  # first half of the result: the second half of gs
        to_second, negated, _ = parts[half]  # second half of the result: minus the first half of gs
        if end_first != half or not _is(negated, aten.neg.default):
            return []
        taken_first = negated.args[0]
        bounds = {}
        for taken in (taken_first, taken_second):
            if not _is(taken, aten.slice.Tensor) or not _last_dim(taken.args[0], taken.args[1]):
                return []
            bounds[taken] = tuple(taken.args[2:4])
        product = taken_first.args[0]
        if taken_second.args[0] is not product or not _is(product, aten.mul.Tensor):
            return []
        if bounds[taken_first] not in ((0, half), (None, half)) or bounds[taken_second][0] != half:
            return []
        if bounds[taken_second][1] is not None and bounds[taken_second][1] < size:
            return []
        region = [product, taken_first, negated, to_second, taken_second, to_first]
        return [
            (grad, sin, region)
            for grad, sin in (product.args, product.args[::-1])
            if isinstance(grad, fx.Node) and isinstance(sin, fx.Node) and _val(grad).shape == _val(product).shape
        ]


def _strided_half(node: Any, x: Any, start: int) -> bool:
    """node is x[..., start::2] (the even or odd lanes of x's last dimension)."""
    if not _is(node, aten.slice.Tensor) or node.args[0] is not x or not _last_dim(x, node.args[1]):
        return False
    args = [*node.args, None, None, None][:5]
    begin, end, step = args[2], args[3], args[4]
    return (begin or 0) == start and (end is None or end >= _val(x).size(-1)) and step == 2


def _interleave_tables_ok(x: Any, cos: Any, sin: Any) -> bool:
    """4-D x, and cos/sin broadcast to it with x's last dimension (the interleave mode's r1, r2)."""
    values = [_val(v) for v in (x, cos, sin)]
    if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in values):
        return False
    shape = values[0].shape
    return all(v.size(-1) == shape[-1] for v in values[1:]) and list(
        torch.broadcast_shapes(*(v.shape for v in values))
    ) == list(shape)


def _float_cast(node: Any) -> fx.Node | None:
    """node when it is a plain dtype conversion (`_to_copy(x, dtype=...)`), else None."""
    if _is(node, aten._to_copy.default) and set(node.kwargs) <= {"dtype"} and len(node.args) == 1:
        return node
    return None


def _casts(node: Any, x: Any, dtype: Any) -> bool:
    """node is x converted to dtype."""
    return _float_cast(node) is not None and node.args[0] is x and _dtype(node) == dtype


class InterleavedRotary(Pattern):
    """x * cos + rotate_interleaved(x) * sin on 4-D tensors, rotate_interleaved(x) written as
    stack([-x[..., 1::2], x[..., 0::2]], -1) viewed back to x's shape, with cos and sin already
    repeated per lane pair (DeepSeek-V4's RoPE on the last rope dims; GPT-J style)
    -> npu_rotary_mul(rotary_mode="interleave"), exactly the formula its documentation gives."""

    name, op = "rotary_interleave", "npu_rotary_mul"
    anchors = (aten.add.Tensor,)

    def match(self, node):
        if len(node.args) != 2 or node.kwargs:
            return None
        for straight, rotated in (node.args, node.args[::-1]):
            if not (_is(straight, aten.mul.Tensor) and _is(rotated, aten.mul.Tensor)):
                continue
            for flat, sin in (rotated.args, rotated.args[::-1]):
                cast = _float_cast(flat)  # bf16 V4: both arms are cast to fp32 (the rotation itself in bf16)
                found = self._rotated(cast.args[0] if cast is not None else flat)
                if found is None:
                    continue
                x, region = found
                arms = [a for a in straight.args if a is x or (cast is not None and _casts(a, x, _dtype(cast)))]
                if len(arms) != 1 or (cast is not None) != (arms[0] is not x):
                    continue
                if cast is not None:
                    region = [*region, cast, arms[0]]
                cos = straight.args[1] if straight.args[0] is arms[0] else straight.args[0]
                if not _interleave_tables_ok(x, cos, sin):
                    continue
                out = _val(node)
                promoted = torch.promote_types(_dtype(arms[0]), torch.promote_types(_dtype(cos), _dtype(sin)))
                if list(out.shape) != list(_val(x).shape) or out.dtype != promoted:
                    continue

                def emit(e: Emitter, x=x, cos=cos, sin=sin, dtype=promoted):
                    # bf16 heads with fp32 tables (V4 in bf16) compute in fp32, as eager's type promotion does
                    x, cos, sin = (e.cast(t, dtype, _dtype(t)) for t in (x, cos, sin))
                    return {node: e.npu("npu_rotary_mul", (x, cos, sin), {"rotary_mode": "interleave"})}

                return Match(self.name, self.op, [*region, straight, rotated, node], emit)
        return None

    def _rotated(self, flat):
        if not _is(flat, aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            return None
        stack = flat.args[0]
        if not _is(stack, aten.stack.default) or len(stack.args[0]) != 2:
            return None
        dim = stack.args[1] if len(stack.args) > 1 else 0
        if not _last_dim(stack, dim):
            return None
        negated, even = stack.args[0]
        if not _is(negated, aten.neg.default) or not _is(even, aten.slice.Tensor):
            return None
        x, odd = even.args[0], negated.args[0]
        if not (_strided_half(even, x, 0) and _strided_half(odd, x, 1)):
            return None
        if list(_val(flat).shape) != list(_val(x).shape):
            return None
        return x, [even, odd, negated, stack, flat]


class DeinterleavedRotary(Pattern):
    """cat([xe * c - xo * s, xo * c + xe * s], -1) with xe, xo = x[..., 0::2], x[..., 1::2] and c, s
    tables of half x's last dimension (transformers' DeepSeek-V3 RoPE: the rotation of each lane pair,
    written back with the rotated even lanes first). That is torch_npu's interleave-mode rotation of x
    followed by a de-interleave of the result, so it lowers to npu_rotary_mul(x, r1, r2, "interleave")
    with r1, r2 = c, s repeated per lane pair (glue on the small tables) and one de-interleaving copy
    of the result (glue): out[..., :D/2] = y[..., 0::2], out[..., D/2:] = y[..., 1::2]."""

    name, op = "rotary_deinterleave", "npu_rotary_mul"
    anchors = (aten.cat.default,)

    def match(self, node):
        parts = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else 0
        if len(parts) != 2 or not _last_dim(node, dim):
            return None
        first, second = parts
        if not (_is(first, aten.sub.Tensor) and _is(second, aten.add.Tensor)) or len(first.args) != 2:
            return None
        if not all(_is(m, aten.mul.Tensor) for m in (*first.args, *second.args)) or len(second.args) != 2:
            return None
        even_cos, odd_sin = first.args  # xe * c - xo * s
        for xe, c in (even_cos.args, even_cos.args[::-1]):
            x = xe.args[0] if _is(xe, aten.slice.Tensor) else None
            if x is None or not _strided_half(xe, x, 0):
                continue
            for xo, s in (odd_sin.args, odd_sin.args[::-1]):
                if not _strided_half(xo, x, 1):
                    continue
                terms = {frozenset(m.args) for m in second.args if len(m.args) == 2}
                if terms != {frozenset((xo, c)), frozenset((xe, s))}:  # xo * c + xe * s
                    continue
                found = self._checked(node, x, xe, c, s)
                if found is not None:
                    return Match(
                        self.name, self.op, [xe, xo, even_cos, odd_sin, *second.args, first, second, node], found
                    )
        return None

    def _checked(self, node, x, xe, c, s):
        values = [_val(v) for v in (x, xe, c, s, node)]
        if not all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in values):
            return None
        vx, vxe, vc, vs, out = values
        size = vx.size(-1)
        if size % 2 or list(out.shape) != list(vx.shape) or out.dtype != vx.dtype:
            return None
        if vc.size(-1) != size // 2 or vs.size(-1) != size // 2:
            return None
        if list(torch.broadcast_shapes(vxe.shape, vc.shape, vs.shape)) != list(vxe.shape):
            return None

        def emit(e: Emitter, x=x, c=c, s=s):
            r1, r2 = (e.aten(aten.repeat_interleave.self_int, t, 2, -1) for t in (c, s))
            y = e.npu("npu_rotary_mul", (x, r1, r2), {"rotary_mode": "interleave"})
            pairs = e.aten(aten.view.default, y, [*vx.shape[:-1], size // 2, 2])
            lanes = e.aten(aten.transpose.int, pairs, -1, -2)
            packed = e.aten(aten.clone.default, lanes, memory_format=torch.contiguous_format)
            return {node: e.aten(aten.view.default, packed, list(vx.shape))}

        return emit


def _sum_terms(node: fx.Node) -> tuple[list[Any], list[fx.Node]]:
    """The terms of a tree of binary aten adds rooted at `node` (inner adds used only by the tree), and
    the inner adds."""
    if not (_is(node, aten.add.Tensor) and len(node.args) == 2 and not node.kwargs):
        return [node], []
    terms, adds = [], []
    for arg in node.args:
        if _is(arg, aten.add.Tensor) and len(arg.users) == 1 and len(arg.args) == 2 and not arg.kwargs:
            inner, inner_adds = _sum_terms(arg)
            terms += inner
            adds += [*inner_adds, arg]
        else:
            terms.append(arg)
    return terms, adds


class GatingTopK(Pattern):
    """topk(softmax(logits, -1), k, -1): MoE gating; the softmax stays where its output is needed elsewhere."""

    name, op = "gating_topk", "npu_moe_gating_top_k_softmax"
    anchors = (aten.topk.default,)

    def match(self, node):
        probs = node.args[0]
        k = node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)
        largest = node.args[3] if len(node.args) > 3 else node.kwargs.get("largest", True)
        if not (
            _is(probs, aten._softmax.default) and largest and _last_dim(probs, dim) and _last_dim(probs, probs.args[1])
        ):
            return None
        logits = probs.args[0]
        if probs.args[2] or _dtype(logits) != _dtype(probs) or _val(logits).dim() not in (2, 3):
            return None
        items = _getitems(node)

        def emit(e: Emitter, logits=logits, k=k):
            fused = e.npu("npu_moe_gating_top_k_softmax", (logits,), {"finished": None, "k": int(k)})
            replaced = {}
            if 0 in items:
                replaced[items[0]] = e.item(fused, 0)
            if 1 in items:
                replaced[items[1]] = e.cast(e.item(fused, 1), _dtype(items[1]), torch.int32)
            return replaced

        return Match(self.name, self.op, [probs, node, *items.values()], emit)


# ---------------------------------------------------------------------------------------------
# MoE primitives (trex.ops.moe): one torch_npu op each (plus index glue).


# npu_moe_init_routing_v2's limits in the 2.13.0 wheel's docs (`_op_plugin_docs.py`): expert_num in (0, 10240] for the
# count mode, x and expert_idx 2-D
INIT_ROUTING_MAX_EXPERTS = 10240


class MoeDispatch(Pattern):
    """trex.moe_dispatch(hidden [T, H], top_k_index [T, k], E) -> (rows sorted by expert [T*k, H], perm [T*k],
    group ends [E]) as one npu_moe_init_routing_v2 (the 2.13.0 wheel's yaml; its docs, `_op_plugin_docs.py`):
    expert_idx int32, dropless (drop_pad_mode=0), no quantisation (quant_mode=-1), all experts active
    (active_expert_range=[0, E]), expert_tokens_num_type=1 (per-expert counts, int64: the docs support only count
    and key_value modes, not cumsum) with expert_tokens_num_flag=True (the only value supported), row_idx_type=1
    (expanded_row_idx in sorted order, the source (token * k + slot) of each expanded row: trex's perm; type 0
    would give the inverse map, one entry per source, -1 for dropped ones). expanded_x[i] = x[perm[i] // k], the
    pairs sorted by expert, stably. The group ends trex's ops carry are the counts' running sum (one cumsum); the
    grouped GEMMs of the same graph take the counts themselves (group_list_type=1, see `GroupedMm`).
    More than 10240 experts (beyond the op's range), or `init_routing=False` (the earlier lowering, kept to compare
    and for a torch_npu without the op): npu_moe_token_permute + npu_moe_compute_expert_tokens."""

    name, op = "moe_dispatch", "npu_moe_init_routing_v2"
    anchors = (trex_ops.moe_dispatch.default,)

    def __init__(self, init_routing: bool = True):
        self.init_routing = init_routing

    def match(self, node):
        hidden, index, num_experts = node.args[:3]
        items = _getitems(node)
        index_value, hidden_value = _val(index), _val(hidden)
        fits = 0 < int(num_experts) <= INIT_ROUTING_MAX_EXPERTS and index_value.dim() == 2 and hidden_value.dim() == 2
        if not (self.init_routing and fits):
            return self._permute_match(node, items)

        def emit(e: Emitter):
            experts = int(num_experts)
            routed = e.npu(
                "npu_moe_init_routing_v2",
                (hidden, e.cast(index, torch.int32, _dtype(index))),
                {
                    "active_num": index_value.numel(),
                    "expert_num": experts,
                    "drop_pad_mode": 0,
                    "expert_tokens_num_type": 1,
                    "expert_tokens_num_flag": True,
                    "quant_mode": -1,
                    "active_expert_range": [0, experts],
                    "row_idx_type": 1,
                },
                allowed={
                    "drop_pad_mode": [0],
                    "expert_tokens_num_type": [1],
                    "expert_tokens_num_flag": [True],
                    "quant_mode": [-1],
                    "row_idx_type": [1],
                    "scale": [None],
                    "offset": [None],
                },
            )
            replaced = {}
            if 0 in items:
                replaced[items[0]] = e.item(routed, 0)
            if 1 in items:
                replaced[items[1]] = e.cast(e.item(routed, 1), _dtype(items[1]), torch.int32)
            if 2 in items:
                counts = e.item(routed, 2)
                ends = e.aten(aten.cumsum.default, counts, 0, dtype=_dtype(items[2]))
                e.group_counts[ends] = counts
                replaced[items[2]] = ends
            return replaced

        return Match(self.name, self.op, [node, *items.values()], emit)

    def _permute_match(self, node, items):
        hidden, index, num_experts = node.args[:3]

        def emit(e: Emitter):
            index64 = e.cast(index, torch.int64, _dtype(index))
            permuted = e.npu(
                "npu_moe_token_permute",
                (hidden, index64),
                {"num_out_tokens": None, "padded_mode": False},
                allowed={"padded_mode": [False]},
            )
            sorted_indices = e.item(permuted, 1)
            sorted_experts = e.aten(
                aten.index_select.default, e.aten(aten.view.default, index, [-1]), 0, sorted_indices
            )
            ends = e.npu(
                "npu_moe_compute_expert_tokens", (e.cast(sorted_experts, torch.int32, _dtype(index)), int(num_experts))
            )
            replaced = {}
            if 0 in items:
                replaced[items[0]] = e.item(permuted, 0)
            if 1 in items:
                replaced[items[1]] = e.cast(sorted_indices, _dtype(items[1]), torch.int32)
            if 2 in items:
                replaced[items[2]] = e.cast(ends, _dtype(items[2]), torch.int32)
            return replaced

        return Match(
            self.name, "npu_moe_token_permute", [node, *items.values()], emit, ["npu_moe_compute_expert_tokens"]
        )


def _group_list(e: Emitter, offsets: fx.Node) -> tuple[fx.Node, int]:
    """npu_grouped_matmul's group_list and group_list_type for trex's group ends: the per-expert counts
    npu_moe_init_routing_v2 returned (type 1) when the ends were summed from them in this graph, else the ends
    cast to int64 (type 0, cumulative)."""
    counts = e.group_counts.get(e.resolve(offsets))
    if counts is not None:
        return counts, 1
    return e.cast(offsets, torch.int64, _dtype(offsets)), 0


class GroupedMm(Pattern):
    name, op = "grouped_mm", "npu_grouped_matmul"
    anchors = (trex_ops.grouped_mm.default,)

    def match(self, node):
        x, weight, offsets = node.args

        def emit(e: Emitter):
            group_list, group_list_type = _group_list(e, offsets)
            out = e.npu(
                "npu_grouped_matmul",
                ([x], [weight]),
                {"group_list": group_list, "split_item": 3, "group_type": 0, "group_list_type": group_list_type},
                allowed={"group_type": [0], "split_item": [2, 3]},
            )
            return {node: e.item(out, 0)}

        return Match(self.name, self.op, [node], emit)


class GroupedMmWeightGrad(Pattern):
    """trex.grouped_mm_weight_grad(a [S, K], b [S, N], offsets) -> [E, K, N], a_e^T @ b_e per expert:
    npu_grouped_matmul([a^T], [b], group_type=2) (K split; the torch_npu 2.13.0 wheel's meta function takes
    group_type 2 with split_item 2/3, x laid out [K, M], and returns [E, K, N] in x's dtype; MindSpeed-MM's
    grouped-GEMM backward calls it so), which writes the gradient in its inputs' dtype as eager's GEMM does:
    no accumulator to zero-fill, no cast. Inputs of another dtype than the result: npu_grouped_matmul_add into
    a zero-filled fp32 accumulator, cast back."""

    name, op = "grouped_mm_wgrad", "npu_grouped_matmul"
    anchors = (trex_ops.grouped_mm_weight_grad.default,)

    def match(self, node):
        a, b, offsets = node.args
        out = _val(node)
        if _dtype(a) == _dtype(b) == out.dtype:

            def emit_k_split(e: Emitter):
                group_list, group_list_type = _group_list(e, offsets)
                product = e.npu(
                    "npu_grouped_matmul",
                    ([e.aten(aten.t.default, a)], [b]),
                    {"group_list": group_list, "split_item": 3, "group_type": 2, "group_list_type": group_list_type},
                    allowed={"group_type": [2], "split_item": [2, 3]},
                )
                return {node: e.item(product, 0)}

            return Match(self.name, self.op, [node], emit_k_split)

        def emit(e: Emitter):
            zeros = e.aten(aten.zeros.default, list(out.shape), dtype=torch.float32, device=out.device)
            group_list = e.cast(offsets, torch.int64, _dtype(offsets))
            summed = e.npu(
                "npu_grouped_matmul_add",
                (zeros, a, b, group_list),
                {"transpose_x": True, "transpose_weight": False, "group_type": 2, "group_list_type": 0},
                allowed={"transpose_x": [True], "transpose_weight": [False], "group_type": [2]},
            )
            return {node: e.cast(summed, out.dtype, torch.float32)}

        return Match(self.name, "npu_grouped_matmul_add", [node], emit)


_FLOAT_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32, torch.float64: 64}


def _widens_float_exactly(source: torch.dtype | None, target: torch.dtype | None) -> bool:
    """A float converted to a wider float (bf16/fp16 -> fp32 -> fp64): every value survives, so converting back
    to `source` is the identity."""
    return source in _FLOAT_BITS and target in _FLOAT_BITS and _FLOAT_BITS[target] > _FLOAT_BITS[source]


def _narrowed_back(node: fx.Node, dtype: torch.dtype | None) -> list[fx.Node] | None:
    """The users of `node` when every one is a plain conversion to `dtype` (e.g. the model's `.to(bf16)` of a
    combine it ran in fp32), else None."""
    users = list(node.users)
    if users and all(_float_cast(u) is not None and u.args[0] is node and _dtype(u) == dtype for u in users):
        return users
    return None


class MoeCombine(Pattern):
    """trex.moe_combine -> npu_moe_token_unpermute, whose result has the permuted tokens' dtype (the wheel's meta
    function; the op has no output-dtype argument, nor does npu_moe_finalize_routing, whose result also has its
    rows' dtype). A combine run in a wider dtype than the rows (DeepSeek-V3: bf16 rows, fp32 routing weights, so
    fp32) is converted back to the rows' dtype by the model (`.to(hidden.dtype)`, eager runs it). The op's result
    widened and converted back is the result itself (`_widens_float_exactly`), so when every use of the combine
    is that conversion, the conversion takes the op's result directly: no widening glue, no narrowing node."""

    name, op = "moe_combine", "npu_moe_token_unpermute"
    anchors = (trex_ops.moe_combine.default,)

    def match(self, node):
        expert_out, perm, weights = node.args
        rows_dtype = _dtype(expert_out)
        narrowed = _narrowed_back(node, rows_dtype) if _widens_float_exactly(rows_dtype, _dtype(node)) else None

        def emit(e: Emitter):
            out = e.npu(
                "npu_moe_token_unpermute",
                (expert_out, perm),
                {"probs": weights, "padded_mode": False, "restore_shape": None},
                allowed={"padded_mode": [False]},
            )
            if narrowed:
                return dict.fromkeys(narrowed, out)
            return {node: e.cast(out, _dtype(node), rows_dtype)}

        return Match(self.name, self.op, [node, *(narrowed or ())], emit)


class MoeCombineBackward(Pattern):
    """trex.moe_combine_backward -> npu_moe_token_unpermute_grad. When the incoming gradient is an exact widening
    of a narrower float (DeepSeek-V3's backward converts the bf16 gradient to the combine's fp32), the op takes the
    narrow gradient itself: the same values, without the conversion (which then belongs to the region)."""

    name, op = "moe_combine_bwd", "npu_moe_token_unpermute_grad"
    anchors = (trex_ops.moe_combine_backward.default,)

    def match(self, node):
        grad_out, expert_out, perm, weights = node.args
        items = _getitems(node)
        widened = _float_cast(grad_out)
        if not (
            widened is not None
            and len(widened.users) == 1
            and _widens_float_exactly(_dtype(widened.args[0]), _dtype(widened))
        ):
            widened = None
        grad_in = widened.args[0] if widened is not None else grad_out

        def emit(e: Emitter):
            grads = e.npu(
                "npu_moe_token_unpermute_grad",
                (expert_out, grad_in, perm),
                {"probs": weights, "padded_mode": False, "restore_shape": None},
                allowed={"padded_mode": [False]},
            )
            replaced = {}
            if 0 in items:
                replaced[items[0]] = e.cast(e.item(grads, 0), _dtype(items[0]), _dtype(expert_out))
            if 1 in items:
                replaced[items[1]] = e.cast(e.item(grads, 1), _dtype(items[1]), _dtype(weights))
            return replaced

        return Match(self.name, self.op, [*([widened] if widened is not None else []), node, *items.values()], emit)


class MoeDispatchBackward(Pattern):
    name, op = "moe_dispatch_bwd", "npu_moe_token_permute_grad_v2"
    anchors = (trex_ops.moe_dispatch_backward.default,)

    def match(self, node):
        grad_sorted, perm, num_tokens = node.args
        rows = _val(perm).numel()
        if rows % num_tokens:
            return None

        def emit(e: Emitter):
            out = e.npu(
                "npu_moe_token_permute_grad_v2",
                (grad_sorted, perm, int(num_tokens), _dtype(node), rows // int(num_tokens)),
                {"padded_mode": False},
                allowed={"padded_mode": [False]},
            )
            return {node: out}

        return Match(self.name, self.op, [node], emit)


# ---------------------------------------------------------------------------------------------
# Backward regions of the forward patterns above, attention, and group-limited sigmoid gating.


class ClippedSwiGluBackward(Pattern):
    """The gradient of DeepSeek-V4's clamped SwiGLU w.r.t. its input, as autograd writes it:
        cat([silu_backward(g * clamp(up, -L, L), clamp(gate, max=L)) * (gate <= L),
             g * silu(clamp(gate, max=L)) * ((up >= -L) & (up <= L))], -1)
    torch_npu has no backward op for npu_clipped_swiglu, but the clamp is the identity where its
    mask is true, so this is npu_swiglu_backward on the clamped input times the clamp's mask:
        xc = clamp(x, low, high); dx = npu_swiglu_backward(g, xc) * (xc == x)
    with constant bounds low = [-inf]*n + [-L]*n, high = [L]*2n (one clamp for both halves)."""

    name, op = "clipped_swiglu_backward", "npu_swiglu_backward"
    anchors = (aten.cat.default,)

    def match(self, node):
        parts = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if len(parts) != 2 or not _last_dim(node, dim):
            return None
        masked_gate, masked_up = parts
        if not (_is(masked_gate, aten.mul.Tensor) and _is(masked_up, aten.mul.Tensor)):
            return None
        silu_bwd, gate_mask = masked_gate.args
        grad_up, up_mask = masked_up.args
        if not (_is(silu_bwd, aten.silu_backward.default) and _is(gate_mask, aten.le.Scalar)):
            return None
        g_up, clamped_gate = silu_bwd.args
        gate_bounds = _clamp_bounds(clamped_gate)
        if gate_bounds is None or not _is(g_up, aten.mul.Tensor):
            return None
        gate, gate_low, limit = gate_bounds
        if gate_low is not None or not isinstance(limit, (int, float)) or gate_mask.args != (gate, limit):
            return None
        halves = _halves(gate)
        if halves is None or halves[2] is not gate:
            return None
        x, split, _, up = halves
        clamped_up = next((a for a in g_up.args if _clamp_bounds(a) == (up, -limit, limit)), None)
        if clamped_up is None:
            return None
        grad = g_up.args[1] if g_up.args[0] is clamped_up else g_up.args[0]
        # the up half: g * silu(clamp(gate)) masked by -L <= up <= L
        if not (_is(grad_up, aten.mul.Tensor) and _is(up_mask, aten.bitwise_and.Tensor, aten.logical_and.default)):
            return None
        silu = next((a for a in grad_up.args if _is(a, aten.silu.default) and a.args[0] is clamped_gate), None)
        if silu is None or grad not in grad_up.args:
            return None
        bounds = {(n.target, n.args) for n in up_mask.args if isinstance(n, fx.Node)}
        if bounds != {(aten.ge.Scalar, (up, -limit)), (aten.le.Scalar, (up, limit))}:
            return None
        if _dtype(node) != _dtype(x) or _dtype(grad) != _dtype(x):
            return None

        def emit(e: Emitter, x=x, grad=grad, limit=float(limit)):
            half, like = _val(x).size(-1) // 2, _val(x)
            low = torch.cat([torch.full((half,), float("-inf")), torch.full((half,), -limit)]).to(like.dtype)
            high = torch.full((2 * half,), limit, dtype=like.dtype)
            bounds = [e.constant(t.to(like.device), n) for t, n in ((low, "clamp_low"), (high, "clamp_high"))]
            clamped = e.aten(aten.clamp.Tensor, x, *bounds)  # gate half clamped above, up half both ways
            dx = e.npu("npu_swiglu_backward", (grad, clamped), {"dim": -1})
            return {node: e.aten(aten.mul.Tensor, dx, e.aten(aten.eq.Tensor, clamped, x))}

        region = [split, gate, up, clamped_gate, clamped_up, g_up, silu_bwd, gate_mask, masked_gate, silu, grad_up]
        region += [a for a in up_mask.args if isinstance(a, fx.Node)] + [up_mask, masked_up, node]
        return Match(self.name, self.op, region, emit)


def _roles(node: Any) -> dict[str, str]:
    """role -> token of the RMSNorm forward matches that proved what this saved value is."""
    found = {}
    for fact in _facts(node):
        if fact.startswith("rms_norm "):
            _, ident, role = fact.split()
            found[role] = ident
    return found


def _strip_detach(node: Any) -> Any:
    while _is(node, aten.detach.default):
        node = node.args[0]
    return node


class RmsNormBackward(Pattern):
    """The fp32 RMSNorm backward autograd writes for y = w * (x * rstd), rstd = rsqrt(mean(x^2) + eps):
        gw = g * w;  dx = gw * rstd + (sum(gw * x, -1) * -0.5 * rstd^3 / D) * 2x
        dgamma = sum(g * (x * rstd)) over the leading dims
    -> npu_rms_norm_backward(g, x, w, rstd). x, w, rstd and the normalized x are the values the
    forward's RMSNorm match proved to be its input, weight, rstd and x * rstd (saved for the backward)."""

    name, op = "rms_norm_backward", "npu_rms_norm_backward"
    anchors = (aten.add.Tensor,)

    def match(self, node):
        for direct, spread in (node.args, node.args[::-1]):
            found = self._match(node, direct, spread)
            if found is not None:
                return found
        return None

    def _match(self, node, direct, spread):
        if not (_is(direct, aten.mul.Tensor) and _is(spread, aten.mul.Tensor)):
            return None
        gw, rstd = direct.args
        if not _is(gw, aten.mul.Tensor):
            return None
        grad, weight = gw.args
        token = _roles(rstd).get("rstd")
        if token is None or _roles(weight).get("gamma") != token:
            return None
        scaled, doubled = spread.args
        if not (_is(scaled, aten.div.Scalar) and _is(doubled, aten.mul.Scalar) and doubled.args[1] == 2.0):
            return None
        power = doubled.args[0]
        if not (_is(power, aten.pow.Tensor_Scalar) and power.args[1] == 1.0):
            return None
        x = power.args[0]
        if _roles(x).get("x") != token or scaled.args[1] != _val(x).size(-1):
            return None
        expand = scaled.args[0]
        if not _is(expand, aten.expand.default):
            return None
        times_cube = expand.args[0]
        if not _is(times_cube, aten.mul.Tensor):
            return None
        half, cube = times_cube.args
        if not (_is(half, aten.mul.Scalar) and half.args[1] == -0.5 and _is(cube, aten.pow.Tensor_Scalar)):
            return None
        if cube.args[1] != 3 or _roles(_strip_detach(cube.args[0])).get("rstd") != token:
            return None
        row_sum = half.args[0]
        if not (_is(row_sum, aten.sum.dim_IntList) and _is(row_sum.args[0], aten.mul.Tensor)):
            return None
        if set(row_sum.args[0].args) != {gw, x} or not _last_dim(x, row_sum.args[1][0]):
            return None
        detaches = [n for n in (cube.args[0],) if _is(n, aten.detach.default)]
        region = [gw, direct, row_sum.args[0], row_sum, *detaches, cube, half, times_cube, expand, scaled, power]
        region += [doubled, spread, node]
        dgamma = self._weight_grad(grad, token, _val(x).dim())
        if dgamma is not None:
            region += dgamma[1]

        def emit(e: Emitter):
            fused = e.npu("npu_rms_norm_backward", (grad, x, weight, rstd))
            replaced = {node: e.item(fused, 0)}
            if dgamma is not None:
                replaced[dgamma[0]] = e.item(fused, 1)
            return replaced

        return Match(self.name, self.op, region, emit)

    def _weight_grad(self, grad, token, rank):
        """(node holding dgamma, its region) when sum(g * normed, leading dims) -> view [D] is there."""
        for product in grad.users:
            if not _is(product, aten.mul.Tensor) or len(product.args) != 2:
                continue
            other = product.args[1] if product.args[0] is grad else product.args[0]
            if _roles(other).get("normed") != token:
                continue
            for total in product.users:
                if not (_is(total, aten.sum.dim_IntList) and sorted(total.args[1]) == list(range(rank - 1))):
                    continue
                views = [u for u in total.users if _is(u, aten.view.default) and _val(u).dim() == 1]
                if len(views) == 1 and len(total.users) == 1 and len(product.users) == 1:
                    return views[0], [product, total, views[0]]
        return None


# FakeTensor of a saved value -> what a forward match proved about it, for the backward graph's match
# (the forward and backward graphs AOTAutograd partitions from one joint graph share these values).
# (keyed by identity: tensors compare elementwise, so they cannot be weak dictionary keys)
_SAVED_FACTS: dict[int, tuple[weakref.ref, set[str]]] = {}
BOOLEAN_ADDITIVE_MASK = "additive mask: 0 where kept, -inf where masked"


def _facts(node: Any) -> set[str]:
    value = _val(node)
    entry = _SAVED_FACTS.get(id(value)) if isinstance(value, torch.Tensor) else None
    return entry[1] if entry is not None and entry[0]() is value else set()


def _note_fact(node: Any, fact: str) -> None:
    value = _val(node)
    if not isinstance(value, torch.Tensor):
        return
    key = id(value)
    if key not in _SAVED_FACTS or _SAVED_FACTS[key][0]() is not value:
        _SAVED_FACTS[key] = (weakref.ref(value, lambda _, key=key: _SAVED_FACTS.pop(key, None)), set())
    _SAVED_FACTS[key][1].add(fact)


def _has_fact(node: Any, fact: str) -> bool:
    return fact in _facts(node)


def _boolean_additive_mask(mask: Any) -> fx.Node | None:
    """The bool `keep` tensor of mask = where(keep, 0, -inf), else None."""
    if not _is(mask, aten.where.self) or _dtype(mask.args[0]) != torch.bool:
        return None
    keep, zero, neg_inf = mask.args
    values = []
    for v in (zero, neg_inf):
        if _is(v, aten.scalar_tensor.default):
            v = v.args[0]
        values.append(v)
    return keep if values == [0.0, float("-inf")] else None


def _attention_mask_ok(mask: Any, q: Any) -> bool:
    value, query = _val(mask), _val(q)
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 4
        and value.size(1) in (1, query.size(1))
        and value.size(0) in (1, query.size(0))
        and list(value.shape[2:]) == [query.size(2), value.size(3)]
    )


def _flash_options(node: fx.Node, first_option: int) -> tuple[bool, Any, float] | None:
    """(is_causal, attn_mask, scale) of a CPU flash attention call (dropout must be 0)."""
    args = list(node.args) + [None] * 4
    dropout = args[first_option] if args[first_option] is not None else node.kwargs.get("dropout_p", 0.0)
    causal = args[first_option + 1] if args[first_option + 1] is not None else node.kwargs.get("is_causal", False)
    if dropout:
        return None
    mask = node.kwargs.get("attn_mask")
    scale = node.kwargs.get("scale")
    query = _val(node.args[first_option - 3 if first_option == 3 else 1])
    if scale is None:
        scale = query.size(-1) ** -0.5
    return bool(causal), mask, float(scale)


def _npu_mask(e: Emitter, causal: bool, mask: Any, device: torch.device) -> tuple[Any, int]:
    """(atten_mask, sparse_mode): torch_npu masks True where masked. is_causal is top-left causal
    (sparse_mode=2 with the compressed 2048x2048 upper triangle); a verified 0/-inf additive mask
    becomes its bool complement (sparse_mode=0, B1SS or BNSS as given)."""
    if causal:
        ones = e.aten(aten.ones.default, [2048, 2048], dtype=torch.bool, device=device)
        return e.aten(aten.triu.default, ones, 1), 2
    if mask is None:
        return None, 0
    return e.aten(aten.eq.Scalar, mask, float("-inf")), 0


class FlashAttention(Pattern):
    """aten's scaled-dot-product flash attention (the op SDPA lowers to on CPU) -> npu_fusion_attention.

    Called in layout BSND on transposed views of aten's BNSD tensors (its output, BSND-contiguous,
    transposed back has the strides aten's kernel gives, which later views rely on); torch's is_causal -> sparse_mode=2 (leftUpCausal), an additive mask proven to be
    where(keep, 0, -inf) -> atten_mask = ~keep (sparse_mode=0). The logsumexp the backward reads is
    softmax_max + log(softmax_sum) of the fused op's statistics."""

    name, op = "flash_attention", "npu_fusion_attention"
    anchors = (aten._scaled_dot_product_flash_attention_for_cpu.default,)

    def match(self, node):
        q, k, v = node.args[:3]
        options = _flash_options(node, 3)
        if options is None:
            return None
        causal, mask, scale = options
        qv, kv = _val(q), _val(k)
        if causal and qv.size(2) != kv.size(2):
            return None
        # the mask's producer may sit outside the partition being lowered: then the whole-graph match proved it
        proven = mask is not None and (
            _boolean_additive_mask(mask) is not None or _has_fact(mask, BOOLEAN_ADDITIVE_MASK)
        )
        if mask is not None and (causal or not proven or not _attention_mask_ok(mask, q)):
            return None
        if qv.size(1) % kv.size(1) or _dtype(q) != _dtype(k) or _dtype(q) != _dtype(v):
            return None
        items = _getitems(node)
        if mask is not None:
            _note_fact(mask, BOOLEAN_ADDITIVE_MASK)

        def emit(e: Emitter):
            atten_mask, sparse_mode = _npu_mask(e, causal, mask, qv.device)
            bsnd = [e.aten(aten.transpose.int, t, 1, 2) for t in (q, k, v)]
            fused = e.npu(
                "npu_fusion_attention",
                (*bsnd, qv.size(1), "BSND"),
                {"atten_mask": atten_mask, "scale": scale, "keep_prob": 1.0, "sparse_mode": sparse_mode},
                allowed={"keep_prob": [1.0], "sparse_mode": [0, 2]},
            )
            replaced = {}
            if 0 in items:  # BSND-contiguous, as aten's CPU flash kernel lays its output out
                replaced[items[0]] = e.aten(aten.transpose.int, e.item(fused, 0), 1, 2)
            if 1 in items:
                stats_max = e.aten(aten.select.int, e.item(fused, 1), -1, 0)
                stats_sum = e.aten(aten.select.int, e.item(fused, 2), -1, 0)
                lse = e.aten(aten.add.Tensor, stats_max, e.aten(aten.log.default, stats_sum))
                replaced[items[1]] = e.cast(lse, _dtype(items[1]), torch.float32)
            return replaced

        return Match(self.name, self.op, [node, *items.values()], emit)


class FlashAttentionBackward(Pattern):
    """aten's flash attention backward -> npu_fusion_attention_grad, fed the saved logsumexp as
    softmax_max (softmax_sum = 1), which gives the same probabilities exp(s - lse)."""

    name, op = "flash_attention_backward", "npu_fusion_attention_grad"
    anchors = (aten._scaled_dot_product_flash_attention_for_cpu_backward.default,)

    def match(self, node):
        grad, q, k, v, out, lse = node.args[:6]
        options = _flash_options(node, 6)
        if options is None:
            return None
        causal, mask, scale = options
        qv, kv = _val(q), _val(k)
        if causal and qv.size(2) != kv.size(2):
            return None
        if mask is not None and (causal or not _has_fact(mask, BOOLEAN_ADDITIVE_MASK)):
            return None
        if qv.size(1) % kv.size(1) or _dtype(lse) != torch.float32:
            return None
        items = _getitems(node)
        b, n, s = _val(lse).shape

        def emit(e: Emitter):
            atten_mask, sparse_mode = _npu_mask(e, causal, mask, qv.device)
            stats_max = e.aten(
                aten.clone.default, e.aten(aten.expand.default, e.aten(aten.unsqueeze.default, lse, -1), [b, n, s, 8])
            )
            stats_sum = e.aten(aten.ones.default, [b, n, s, 8], dtype=torch.float32, device=_val(lse).device)
            q_, k_, v_, grad_, out_ = (e.aten(aten.transpose.int, t, 1, 2) for t in (q, k, v, grad, out))
            grads = e.npu(
                "npu_fusion_attention_grad",
                (q_, k_, v_, grad_, qv.size(1), "BSND"),
                {
                    "atten_mask": atten_mask,
                    "softmax_max": stats_max,
                    "softmax_sum": stats_sum,
                    "attention_in": out_,
                    "scale_value": scale,
                    "keep_prob": 1.0,
                    "sparse_mode": sparse_mode,
                },
                allowed={"keep_prob": [1.0], "sparse_mode": [0, 2]},
            )
            return {items[i]: e.aten(aten.transpose.int, e.item(grads, i), 1, 2) for i in (0, 1, 2) if i in items}

        return Match(self.name, self.op, [node, *items.values()], emit)


def _through(node: Any, *targets: Any) -> tuple[Any, list[fx.Node]]:
    """Follow single-input view/copy nodes of the given kinds up to the first other node."""
    passed = []
    while _is(node, *targets):
        passed.append(node)
        node = node.args[0]
    return node, passed


class GroupLimitedGating(Pattern):
    """DeepSeek-V3's noaux_tc routing -> npu_moe_gating_top_k(norm_type=1 (sigmoid), group_select_mode=1):
        s = sigmoid(logits); c = s + e_score_correction_bias
        groups: top-2 sum of c per group, keep top k_group groups (others -inf)
        idx = topk(c, k); w = s[idx] / (sum(s[idx]) + eps) * routed_scaling_factor
    The sigmoid is replaced by the op's norm_out (out_flag=True), the indices and weights by its outputs."""

    name, op = "group_limited_gating", "npu_moe_gating_top_k"
    anchors = (aten.mul.Tensor,)
    _VIEWS = (
        aten._to_copy.default,
        aten._unsafe_view.default,
        aten.view.default,
        aten.clone.default,
        aten.expand.default,
        aten.unsqueeze.default,
    )

    def match(self, node):
        div, scaling = node.args
        if not (_is(div, aten.div.Tensor) and isinstance(scaling, (int, float))):
            return None
        gathered, denominator = div.args
        if not (_is(gathered, aten.gather.default) and _is(denominator, aten.add.Tensor)):
            return None
        total, eps = denominator.args
        if not (_is(total, aten.sum.dim_IntList) and total.args[0] is gathered and isinstance(eps, float)):
            return None
        norm, gather_dim, index_item = gathered.args
        if not (_is(norm, aten.sigmoid.default) and gather_dim in (1, -1) and _is(index_item, operator.getitem)):
            return None
        x = norm.args[0]
        topk = index_item.args[0]
        if not _is(topk, aten.topk.default) or index_item.args[1] != 1:
            return None
        masked, k = topk.args[:2]
        if not _is(masked, aten.masked_fill.Scalar) or masked.args[2] != float("-inf"):
            return None
        choice, not_kept = masked.args[:2]
        bias = None
        if _is(choice, aten.add.Tensor) and choice.args[0] is norm and isinstance(choice.args[1], fx.Node):
            bias = choice.args[1]
        elif choice is not norm:
            return None
        if not _is(not_kept, aten.bitwise_not.default):
            return None
        scatter, views = _through(not_kept.args[0], *self._VIEWS)
        if not (_is(scatter, aten.scatter.value) and scatter.args[3] == 1 and scatter.args[1] in (1, -1)):
            return None
        zeros, _, group_item = scatter.args[:3]
        group_topk = group_item.args[0] if _is(group_item, operator.getitem) else None
        if not (_is(zeros, aten.zeros_like.default) and _is(group_topk, aten.topk.default)):
            return None
        group_scores, k_group = group_topk.args[:2]
        if zeros.args[0] is not group_scores or not _is(group_scores, aten.sum.dim_IntList):
            return None
        top2_item = group_scores.args[0]
        top2 = top2_item.args[0] if _is(top2_item, operator.getitem) else None
        if not (_is(top2, aten.topk.default) and top2.args[1] == 2 and _is(top2.args[0], aten.view.default)):
            return None
        grouped = top2.args[0]
        xv = _val(x)
        if grouped.args[0] is not choice or xv.dim() != 2:
            return None
        group_count = _val(grouped).size(1)
        if bias is not None and (_dtype(bias) != _dtype(x) or list(_val(bias).shape) != [xv.size(1)]):
            return None
        index_items = _getitems(topk)
        region = [norm, grouped, top2, top2_item, group_scores, group_topk, group_item, zeros, scatter, *views]
        region += [not_kept, masked, topk, *index_items.values(), gathered, total, denominator, div, node]
        if bias is not None:
            region.append(choice)
        _note_fact(denominator, f"gating eps {eps!r}")

        def emit(e: Emitter):
            fused = e.npu(
                "npu_moe_gating_top_k",
                (x, int(k)),
                {
                    "bias": bias,
                    "k_group": int(k_group),
                    "group_count": int(group_count),
                    "group_select_mode": 1,
                    "renorm": 0,
                    "norm_type": 1,
                    "out_flag": True,
                    "routed_scaling_factor": float(scaling),
                    "eps": eps,
                },
                allowed={"renorm": [0], "norm_type": [1]},
            )
            replaced = {
                node: e.cast(e.item(fused, 0), _dtype(node), _dtype(x)),
                norm: e.cast(e.item(fused, 2), _dtype(norm), torch.float32),
            }
            replaced[index_item] = e.cast(e.item(fused, 1), _dtype(index_item), torch.int32)
            return replaced

        return Match(self.name, self.op, region, emit)


class GroupLimitedGatingBackward(Pattern):
    """The gradient of the gating weights w.r.t. the router logits, as autograd writes it:
        g2 = g * rsf; dw = g2 / d - sum(g2 * (w_raw / d) / d); ds = scatter_add(zeros, 1, idx, dw)
        dx = sigmoid_backward(ds, s)
    -> npu_moe_gating_top_k_backward(s, g, idx, norm_type=1, routed_scaling_factor=rsf, eps)."""

    name, op = "group_limited_gating_backward", "npu_moe_gating_top_k_backward"
    anchors = (aten.sigmoid_backward.default,)

    def match(self, node):
        scattered, norm = node.args
        if not _is(scattered, aten.scatter_add.default) or scattered.args[1] not in (1, -1):
            return None
        zeros, _, index, grad_w = scattered.args
        if not (_is(zeros, aten.new_zeros.default) and _is(grad_w, aten.add.Tensor)):
            return None
        direct, spread = grad_w.args
        if not (_is(direct, aten.div.Tensor) and _is(spread, aten.expand.default)):
            return None
        scaled, denominator = direct.args
        if not (_is(scaled, aten.mul.Tensor) and isinstance(scaled.args[1], (int, float))):
            return None
        grad, scaling = scaled.args
        eps = next((float(f.split()[-1]) for f in _facts(denominator) if f.startswith("gating eps")), None)
        row_sum = spread.args[0]
        if eps is None or not _is(row_sum, aten.sum.dim_IntList):
            return None
        product = row_sum.args[0]
        if not _is(product, aten.mul.Tensor):
            return None
        negated, ratio = product.args
        if not (_is(negated, aten.neg.default) and negated.args[0] is scaled and _is(ratio, aten.div.Tensor)):
            return None
        inner = ratio.args[0]
        if not (_is(inner, aten.div.Tensor) and inner.args[1] is denominator and ratio.args[1] is denominator):
            return None
        if _val(norm).dim() != 2 or _dtype(norm) != torch.float32:
            return None

        def emit(e: Emitter):
            dx = e.npu(
                "npu_moe_gating_top_k_backward",
                (norm, grad, e.cast(index, torch.int32, _dtype(index))),
                {"renorm": 0, "norm_type": 1, "routed_scaling_factor": float(scaling), "eps": eps},
                allowed={"renorm": [0], "norm_type": [1]},
            )
            return {node: e.cast(dx, _dtype(node), _dtype(grad))}

        region = [zeros, scattered, direct, spread, scaled, row_sum, product, negated, ratio, inner, grad_w, node]
        return Match(self.name, self.op, region, emit)


PATTERNS: tuple[Pattern, ...] = (
    MoeDispatch(),
    GroupedMm(),
    GroupedMmWeightGrad(),
    MoeCombine(),
    MoeCombineBackward(),
    MoeDispatchBackward(),
    RmsNorm(),
    ClippedSwiGlu(),
    SwiGlu(),
    SwiGluBackward(),
    Rotary(),
    RotaryBackward(),
    InterleavedRotary(),
    DeinterleavedRotary(),
    GatingTopK(),
    ClippedSwiGluBackward(),
    FlashAttention(),
    FlashAttentionBackward(),
    GroupLimitedGating(),
    GroupLimitedGatingBackward(),
    RmsNormBackward(),
)


def find_matches(graph: fx.Graph, patterns: Sequence[Pattern] = PATTERNS) -> list[Match]:
    """Non-overlapping matches, scanning anchors in graph order (a node belongs to one region at most)."""
    by_anchor: dict[Any, list[Pattern]] = {}
    for pattern in patterns:
        for anchor in pattern.anchors:
            by_anchor.setdefault(anchor, []).append(pattern)
    taken: set[fx.Node] = set()
    matches: list[Match] = []
    for node in graph.nodes:
        if node.op != "call_function" or node in taken:
            continue
        for pattern in by_anchor.get(node.target, ()):
            try:
                match = pattern.match(node)
            except (AttributeError, IndexError, KeyError, TypeError, ValueError):
                match = None  # an unexpected argument layout is simply not this pattern
            if match is not None and not (set(match.nodes) & taken):
                matches.append(match)
                taken.update(match.nodes)
                break
    return matches
