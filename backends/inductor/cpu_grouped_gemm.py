"""trex's CPU grouped GEMM: one C++ call computes every expert's GEMM of an fp32 MoE layer.

Why: aten's CPU `_grouped_mm` runs one oneMKL `sgemm` per expert. With few rows per expert - tiny Qwen3-MoE has
256 sorted rows over 8 experts, 64 x 64 weights - each call's fixed cost is as large as its arithmetic: one
32 x 64 x 64 `mm` took 4.5 us on the development CPU (AMD EPYC, AVX-512) where the whole 256 x 64 x 64 product
takes 21.8 us as one `mm`, and the grouped call 31.5 us (bench/cpu_ops/grouped_gemm_kernel.py; bench/RESULTS.md
section 11, fifteenth session). A tiny MoE training step makes 24 such calls.

What it is: a register-blocked kernel written with ATen's portable vector type (`at::vec::Vectorized<float>`,
AVX-512 / AVX2 / NEON as Inductor's own C++ kernels pick it), built by Inductor's C++ code cache
(`CppPythonBindingsCodeCache`: the same compiler, flags and precompiled header as Inductor's kernels) once per
process, and called from Inductor's generated code as an extern kernel with an `out=` buffer. Three layouts, the
three a grouped GEMM takes in a training step:

* rows times weights, `out[rows of g] = a[rows of g] @ b[g]` (the forward, and the input gradient): tiles of 4
  rows x 4 vectors of columns, one panel of the weight (depth x 4 vectors of columns) reused by every row tile of
  the group while it is in cache. A weight read transposed (transformers' experts keep `[E, out, in]` and the
  forward multiplies by its transpose) is first copied panel by panel into a contiguous panel with ATen's
  16 x 16 vector transpose - a dot-product form without the copy was slower at small depths, where adding up
  each vector's lanes costs more than its multiply-adds (14.0 vs 21.1 us on the 256 x 32 x 64 problem);
* the weight gradient, `out[g] = a[rows of g]^T @ b[rows of g]`: the same tiles with the group's rows as the
  depth.

Each output element is one sum over the depth in order (fp32 fused multiply-adds), so the values differ from
oneMKL's by float rounding only (on the tiny models' problems they were bit-equal); they do not depend on the
thread count. Rows past the last offset are zero, and so is the weight gradient of a group without rows. Large
problems split over OpenMP threads by group.

Whether a grouped GEMM runs on it is measured, not assumed (`place`): at the node's shapes and strides
with the rows spread evenly over the groups, this kernel against aten's, each distinct problem once per
process; the lowering takes the faster (`InductorBackend(cpu_grouped_gemm="trex" | "aten")` fixes the choice). For
large experts oneMKL's cache blocking wins and aten keeps them (4096 rows, 16 groups, 512 x 256: 12.0 vs 11.5 ms).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# mode argument of the C++ entry point
GROUPED_ROWS = 0  # out[M, N]: rows of a grouped, one b[g] per group
GROUPED_DEPTH = 1  # out[G, K, N]: a's rows grouped, summed over (the weight gradient)

ARGTYPES = ("const float*", "const float*", "const int32_t*", "float*") + ("int64_t",) * 11

SOURCE = r"""#include <torch/csrc/inductor/cpp_prefix.h>
#include <algorithm>
#include <vector>

// C(i, n) = sum_p A(i, p) * B(p, n) for one tile: MR rows of C, `width` (<= NV vectors) columns.
// A(i, p) = a[i * a_i + p * a_p]; B(p, n) = b[p * b_p + n] (columns contiguous); C rows c_row apart.
template <int MR, int NV>
static inline void tile(const float* a, int64_t a_i, int64_t a_p, const float* b, int64_t b_p, float* c,
                        int64_t c_row, int64_t depth, int64_t width) {
    using Vec = at::vec::Vectorized<float>;
    constexpr int L = Vec::size();
    Vec acc[MR][NV];
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < NV; ++v) acc[i][v] = Vec(0.f);
    const int64_t tail = width - (NV - 1) * L;  // lanes of the last vector, 1..L
    for (int64_t p = 0; p < depth; ++p) {
        const float* row = b + p * b_p;
        Vec bv[NV];
        for (int v = 0; v < NV - 1; ++v) bv[v] = Vec::loadu(row + v * L);
        bv[NV - 1] = tail == L ? Vec::loadu(row + (NV - 1) * L) : Vec::loadu(row + (NV - 1) * L, tail);
        for (int i = 0; i < MR; ++i) {
            const Vec av(a[i * a_i + p * a_p]);
            for (int v = 0; v < NV; ++v) acc[i][v] = at::vec::fmadd(av, bv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < MR; ++i) {
        float* out = c + i * c_row;
        for (int v = 0; v < NV - 1; ++v) acc[i][v].store(out + v * L);
        if (tail == L) acc[i][NV - 1].store(out + (NV - 1) * L);
        else acc[i][NV - 1].store(out + (NV - 1) * L, tail);
    }
}

template <int MR>
static inline void panel_rows(const float* a, int64_t a_i, int64_t a_p, const float* b, int64_t b_p, float* c,
                              int64_t c_row, int64_t depth, int64_t width) {
    constexpr int L = at::vec::Vectorized<float>::size();
    if (width > 3 * L) tile<MR, 4>(a, a_i, a_p, b, b_p, c, c_row, depth, width);
    else if (width > 2 * L) tile<MR, 3>(a, a_i, a_p, b, b_p, c, c_row, depth, width);
    else if (width > L) tile<MR, 2>(a, a_i, a_p, b, b_p, c, c_row, depth, width);
    else tile<MR, 1>(a, a_i, a_p, b, b_p, c, c_row, depth, width);
}

// Every row of the block times one panel of B (depth x width, columns contiguous), 4 rows at a time: the
// panel stays in cache while the rows stream past it.
static void panel(const float* a, int64_t a_i, int64_t a_p, const float* b, int64_t b_p, float* c, int64_t c_row,
                  int64_t rows, int64_t depth, int64_t width) {
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4) panel_rows<4>(a + i * a_i, a_i, a_p, b, b_p, c + i * c_row, c_row, depth, width);
    const float* a_rest = a + i * a_i;
    float* c_rest = c + i * c_row;
    switch (rows - i) {
        case 3: panel_rows<3>(a_rest, a_i, a_p, b, b_p, c_rest, c_row, depth, width); break;
        case 2: panel_rows<2>(a_rest, a_i, a_p, b, b_p, c_rest, c_row, depth, width); break;
        case 1: panel_rows<1>(a_rest, a_i, a_p, b, b_p, c_rest, c_row, depth, width); break;
        default: break;
    }
}

// C[rows x cols] = A @ B with B(p, n) = b[p * b_p + n * b_n], in panels of 4 vectors of columns. A panel whose
// columns are not contiguous (a transposed weight: b_p == 1) is first copied into a contiguous one.
static void block(const float* a, int64_t a_i, int64_t a_p, const float* b, int64_t b_p, int64_t b_n, float* c,
                  int64_t c_row, int64_t rows, int64_t depth, int64_t cols) {
    if (rows <= 0 || cols <= 0) return;
    if (depth <= 0) {
        for (int64_t i = 0; i < rows; ++i) std::fill(c + i * c_row, c + i * c_row + cols, 0.f);
        return;
    }
    constexpr int64_t PANEL = 4 * at::vec::Vectorized<float>::size();
    thread_local std::vector<float> packed;
    for (int64_t n0 = 0; n0 < cols; n0 += PANEL) {
        const int64_t width = std::min(PANEL, cols - n0);
        if (b_n == 1) {
            panel(a, a_i, a_p, b + n0, b_p, c + n0, c_row, rows, depth, width);
            continue;
        }
        packed.resize(depth * width);
        const float* source = b + n0 * b_n;
        if (b_p == 1) {
            // width rows of `depth` contiguous values -> depth rows of `width`
            at::vec::transpose_mxn<float>(source, b_n, packed.data(), width, (int)width, (int)depth);
        } else {
            for (int64_t p = 0; p < depth; ++p)
                for (int64_t n = 0; n < width; ++n) packed[p * width + n] = source[p * b_p + n * b_n];
        }
        panel(a, a_i, a_p, packed.data(), width, c + n0, c_row, rows, depth, width);
    }
}

// mode 0 (grouped rows): out[M, N] (rows out_row apart) = rows [offs[g-1], offs[g]) of a[M, K] times b[g] (K x N);
//   rows past offs[groups - 1] are zero.
// mode 1 (grouped depth): out[G, K, N] contiguous; out[g] = a[:, rows of g] @ b[rows of g, :] with a read as K x M
//   (strides a_s0, a_s1) and b as M x N (strides b_s0, b_s1).
extern "C" void kernel(const float* a, const float* b, const int32_t* offs, float* out, int64_t mode,
                       int64_t groups, int64_t m, int64_t k, int64_t n, int64_t a_s0, int64_t a_s1, int64_t b_s0,
                       int64_t b_s1, int64_t b_s2, int64_t out_row) {
    const bool parallel = m * k * n > ((int64_t)1 << 22);  // below ~4M multiply-adds one thread is faster
    if (mode == 0) {
        #pragma omp parallel for schedule(dynamic, 1) if (parallel)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t start = g == 0 ? 0 : std::min<int64_t>(offs[g - 1], m);
            const int64_t end = std::min<int64_t>(offs[g], m);
            block(a + start * a_s0, a_s0, a_s1, b + g * b_s0, b_s1, b_s2, out + start * out_row, out_row,
                  end - start, k, n);
        }
        const int64_t covered = groups > 0 ? std::max<int64_t>(std::min<int64_t>(offs[groups - 1], m), 0) : 0;
        for (int64_t r = covered; r < m; ++r) std::fill(out + r * out_row, out + r * out_row + n, 0.f);
    } else {
        #pragma omp parallel for schedule(dynamic, 1) if (parallel)
        for (int64_t g = 0; g < groups; ++g) {
            const int64_t start = g == 0 ? 0 : std::min<int64_t>(offs[g - 1], m);
            const int64_t end = std::min<int64_t>(offs[g], m);
            block(a + start * a_s1, a_s0, a_s1, b + start * b_s0, b_s0, b_s1, out + g * k * n, n, k,
                  std::max<int64_t>(end - start, 0), n);
        }
    }
}
"""


@functools.cache
def _build() -> Callable[[], Any]:
    """Start building the kernel (once per process); returns what waits for it. Inductor's compile threads build
    it next to the generated kernels; with one compile thread it builds here."""
    from torch._inductor.async_compile import get_compile_threads
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    if get_compile_threads() <= 1:
        kernel = CppPythonBindingsCodeCache.load_pybinding(list(ARGTYPES), SOURCE)
        return lambda: kernel
    from torch._inductor.async_compile import AsyncCompile

    return CppPythonBindingsCodeCache.load_pybinding_async(list(ARGTYPES), SOURCE, submit_fn=AsyncCompile.submit)


def start_build() -> None:
    """Begin building the kernel in the background, so that it is ready when a lowering times it."""
    _build()


@functools.cache
def kernel() -> Callable[..., None]:
    """The built kernel (building it now if no build was started)."""
    return _build()()


def takes(*operands: torch.Tensor) -> bool:
    """Whether the kernel computes these operands: fp32, on the CPU."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in operands)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    """out[rows of g] = a[rows of g] @ b[g] (`torch._grouped_mm(a, b, offs=offsets)` for a 2-D a and 3-D b);
    offsets int32 cumulative row ends; rows of `out` past the last offset are zeroed."""
    m, depth = a.shape
    groups, _, n = b.shape
    if out.stride(1) != 1:
        raise ValueError(f"trex's CPU grouped GEMM writes rows of contiguous columns; out has strides {out.stride()}")
    kernel()(a, b, offsets, out, GROUPED_ROWS, groups, m, depth, n, *a.stride(), *b.stride(), out.stride(0))
    return out


def grouped_mm_weight_grad(
    a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    """out[g] = a[rows of g]^T @ b[rows of g] (a [M, K], b [M, N], out [G, K, N] contiguous); a group without
    rows gets zeros."""
    m, depth = a.shape
    n = b.shape[1]
    groups = offsets.shape[0]
    if not out.is_contiguous():
        raise ValueError(f"trex's CPU grouped GEMM writes a contiguous weight gradient; out has strides {out.stride()}")
    a_k, a_m = a.stride(1), a.stride(0)  # a read as its transpose, K x M
    kernel()(a, b, offsets, out, GROUPED_DEPTH, groups, m, depth, n, a_k, a_m, b.stride(0), b.stride(1), 0, n)
    return out


# How an fp32 CPU grouped GEMM is placed (`InductorBackend`'s `cpu_grouped_gemm` argument): "timed" measures this
# kernel and aten's at the problem's shapes and takes the faster, "trex" always takes this kernel, "aten" never
# does (aten's `_grouped_mm`, the lowering before this kernel existed).
POLICIES = ("timed", "trex", "aten")

GROUPED_GEMM_OPS = ("extern_grouped_mm", "extern_grouped_mm_weight_grad")


@dataclass
class Choice:
    """One grouped GEMM problem of a region: its description, the two timings (None when not timed), the pick."""

    problem: str
    aten_us: float | None
    kernel_us: float | None
    on_kernel: bool


@dataclass
class Placement:
    """Where each fp32 grouped GEMM problem of one region runs, decided before Inductor lowers the region."""

    policy: str
    on_kernel: dict[tuple, bool] = field(default_factory=dict)  # problem_key -> runs on this kernel
    choices: list[Choice] = field(default_factory=list)

    def uuid(self) -> str:
        """What Inductor's graph cache must key on: the same graph with other placements is other code."""
        import hashlib

        text = repr((SOURCE, self.policy, sorted(self.on_kernel.items())))
        return hashlib.sha256(text.encode()).hexdigest()


_PLACEMENT: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("trex_cpu_grouped_gemm", default=None)
_TIMINGS: dict[tuple, tuple[float, float]] = {}


def problem_key(a: torch.Tensor, b: torch.Tensor, groups: int, weight_grad: bool) -> tuple:
    return (tuple(a.shape), tuple(a.stride()), tuple(b.shape), tuple(b.stride()), groups, weight_grad)


def _problem(node: Any) -> tuple[torch.Tensor, torch.Tensor, int, bool] | None:
    """(a, b, groups, weight_grad) of an FX node that is one of trex's fp32 CPU grouped GEMMs, else None."""
    target = getattr(node, "target", None)
    if node.op != "call_function" or getattr(target, "namespace", None) != "trex":
        return None
    name = target._schema.name.split("::")[-1] if hasattr(target, "_schema") else ""
    if name not in GROUPED_GEMM_OPS:
        return None
    values = [getattr(arg, "meta", {}).get("val") for arg in node.args[:3]]
    if not all(isinstance(v, torch.Tensor) for v in values) or not takes(values[0], values[1]):
        return None
    return values[0], values[1], values[2].shape[0], name == "extern_grouped_mm_weight_grad"


def has_grouped_gemms(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph has an fp32 CPU grouped GEMM this kernel could compute."""
    return any(_problem(node) is not None for node in gm.graph.nodes)


def place(gm: torch.fx.GraphModule, policy: str) -> Placement:
    """Decide, by `policy`, where each fp32 CPU grouped GEMM problem of `gm` runs ("timed": both kernels timed at
    the problem's shapes and strides, the faster taken)."""
    if policy not in POLICIES:
        raise ValueError(f"cpu_grouped_gemm={policy!r}: expected one of {', '.join(POLICIES)}")
    placement = Placement(policy)
    for node in gm.graph.nodes:
        problem = _problem(node)
        if problem is None:
            continue
        key = problem_key(*problem)
        if key in placement.on_kernel:
            continue
        a, b, groups, weight_grad = problem
        if policy == "timed":
            aten, ours = aten_and_kernel_seconds(a, b, groups, weight_grad)
            on_kernel, timings = ours < aten, (aten * 1e6, ours * 1e6)
        else:
            on_kernel, timings = policy == "trex", (None, None)
        placement.on_kernel[key] = on_kernel
        form = "weight gradient" if weight_grad else "rows"
        problem_text = f"{form} {tuple(a.shape)} x {tuple(b.shape)}, {groups} groups"
        placement.choices.append(Choice(problem_text, *timings, on_kernel))
    return placement


@contextlib.contextmanager
def placing(placement: Placement) -> Iterator[Placement]:
    """Inside: Inductor's lowering puts each grouped GEMM where `placement` says, and its graph cache keys the
    compiled code on the placement (a no-op post-grad pass whose uuid is the placement's, beside any the user set)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class PlacementKey(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            return None

        def uuid(self) -> str:
            return placement.uuid()

    existing = inductor_config.post_grad_custom_post_pass
    passes = [] if existing is None else list(existing) if isinstance(existing, (list, tuple)) else [existing]
    token = _PLACEMENT.set(placement)
    try:
        with inductor_config.patch(post_grad_custom_post_pass=[*passes, PlacementKey()]):
            yield placement
    finally:
        _PLACEMENT.reset(token)


def on_kernel(a: torch.Tensor, b: torch.Tensor, groups: int, weight_grad: bool) -> bool:
    """For the lowering: whether this grouped GEMM problem runs on this kernel - the enclosing placement's pick;
    aten's kernel for a problem it did not place and outside any placement (a graph trex did not hand over)."""
    placement = _PLACEMENT.get()
    if placement is None:
        return False
    return placement.on_kernel.get(problem_key(a, b, groups, weight_grad), False)


def _balanced_offsets(rows: int, groups: int) -> torch.Tensor:
    return torch.tensor([rows * (g + 1) // groups for g in range(groups)], dtype=torch.int32)


def aten_and_kernel_seconds(a: torch.Tensor, b: torch.Tensor, groups: int, weight_grad: bool) -> tuple[float, float]:
    """(aten's, this kernel's) seconds per call on operands with the layouts of `a` and `b` (FakeTensors are
    fine: only shapes, strides and dtypes are read), rows spread evenly over `groups`; measured once per
    distinct problem in a process."""
    key = problem_key(a, b, groups, weight_grad)
    if key in _TIMINGS:
        return _TIMINGS[key]
    from torch.utils._python_dispatch import _disable_current_modes

    from trex.passes.cpu_gemm_precision.timing import best_seconds_per_call, example_tensor

    # real tensors, outside any FakeTensorMode / Python dispatcher the compile runs under (as in timing.py)
    with _disable_current_modes(), torch._C.DisableTorchFunction(), torch._C._DisablePythonDispatcher():
        x, y = example_tensor(a), example_tensor(b)
        offsets = _balanced_offsets(a.shape[0], groups)
        with torch.no_grad():
            if weight_grad:
                out = torch.empty(groups, a.shape[1], b.shape[1])
                aten = best_seconds_per_call(lambda: torch._grouped_mm(x.t(), y, offs=offsets), 3, 5)
                ours = best_seconds_per_call(lambda: grouped_mm_weight_grad(x, y, offsets, out=out), 3, 5)
            else:
                out = torch.empty(a.shape[0], b.shape[2])
                aten = best_seconds_per_call(lambda: torch._grouped_mm(x, y, offs=offsets), 3, 5)
                ours = best_seconds_per_call(lambda: grouped_mm(x, y, offsets, out=out), 3, 5)
    _TIMINGS[key] = (aten, ours)
    return aten, ours


def summary(choices: Sequence[Choice]) -> str:
    """One line for a region's notes: how many fp32 grouped GEMM problems run on this kernel, and the timings."""
    on = sum(c.on_kernel for c in choices)
    timed = [c for c in choices if c.aten_us is not None]
    line = f"cpu grouped GEMM: {on} of {len(choices)} fp32 grouped GEMM problems on trex's kernel"
    if timed:
        shown = "; ".join(f"{c.problem}: aten {c.aten_us:.1f} us, trex {c.kernel_us:.1f} us" for c in timed)
        line += f" (timed here: {shown})"
    return line
