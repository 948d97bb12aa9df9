"""Build the C++ kernels of a compiled graph as a few shared libraries, not one library per kernel.

Why: on CPU, Inductor gives every generated kernel its own `g++` process, which compiles the kernel and its
Python binding against the precompiled `cpp_prefix.h` header and links a shared library against libtorch.
Measured on the 2-vCPU development machine (bench/RESULTS.md 11, fourteenth session; one kernel of tiny
Qwen3-MoE's forward built by hand with Inductor's own command line): 0.87 s for the build, of which 0.43 s is
the same for an empty source - loading the 155 MB precompiled header (~0.3 s) and the link (~0.2 s) - and
only ~0.45 s is the kernel's own code. A tiny MoE model's first call builds 28 (Qwen3-MoE) to ~60 (DeepSeek-V4)
such kernels, so about half of the C++ build time, most of a cold first call, is that fixed cost paid again
and again.

What this does: while a trex region's generated wrapper module loads, each `AsyncCompile.cpp_pybinding` call
(one per kernel) is collected instead of built; when the module first waits for a kernel (its last statement,
`async_compile.wait(globals())`), the collected kernels are split into as many bundles as Inductor has compile
threads (balanced by source length) and each bundle is built by Inductor's own cache
(`CppPythonBindingsCodeCache.load_async`: the same compiler, flags, precompiled header, locks and loading) as
ONE translation unit: every kernel's source inside a namespace of its own, followed by one Python entry point
per kernel. The kernels' code is the code Inductor generated, compiled with the same flags, so the values and
the step time are unchanged; only the number of compiler processes falls from one per kernel to one per
compile thread.

What is not bundled (built by Inductor as before): a kernel source with preprocessor directives other than
`#include` at file scope or more than one `extern "C"` function; an argument type the entry points do not
parse; compiles with a single compile thread (Inductor then builds each kernel synchronously, and its `wait`
resolves nothing). If a bundle fails to build or load, its kernels are built one by one by Inductor's own path
(correct, slower) and the failure is kept in `KernelBundler.failures`.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

# The argument types the bundle's entry points convert from Python objects, besides pointers (tensors).
_SCALAR_ARGUMENTS = ("int64_t", "uintptr_t", "float", "double")

_ENTRY = re.compile(r'^extern "C"\s+void\s+kernel\(', re.MULTILINE)


@dataclass
class BundledKernel:
    """One kernel Inductor asked to build: its entry's argument types and its C++ source."""

    argtypes: tuple[str, ...]
    source: str
    index: int  # its place in the bundler: entry point `kernel_<index>`, namespace `trex_kernel_<index>`
    bundle: KernelBundle | None = None


@dataclass
class KernelBundle:
    """Kernels compiled as one translation unit into one Python extension module."""

    kernels: list[BundledKernel]
    get_module: Callable[[], Any] | None = None  # Inductor's loader, once the build was submitted
    module: Any = None
    fallback: dict[int, Callable[..., Any]] | None = None  # index -> kernel built alone, if the bundle failed


def can_bundle(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph with these inputs may have its kernels bundled: a CPU graph compiled with Inductor's
    Python wrapper (the C++ wrapper builds its kernels with the wrapper already), without max-autotune (whose
    benchmarks run kernels while the graph compiles)."""
    import torch
    import torch._inductor.config as inductor_config

    if inductor_config.max_autotune or inductor_config.max_autotune_gemm or inductor_config.cpp_wrapper:
        return False
    return all(x.device.type == "cpu" for x in example_inputs if isinstance(x, torch.Tensor))


def bundleable(argtypes: Sequence[str], source: str) -> bool:
    """Whether a kernel source can go into a bundle unchanged but for its entry's linkage (module docstring)."""
    if len(_ENTRY.findall(source)) != 1 or source.count('extern "C"') != 1:
        return False
    for line in source.splitlines():
        if line.startswith("#") and not line.startswith("#include"):
            return False
    return all(_parsed_type(a).endswith("*") or _parsed_type(a) in _SCALAR_ARGUMENTS for a in argtypes)


def _parsed_type(argtype: str) -> str:
    """The type an entry point converts an argument to: Inductor declares sizes `const int64_t` and inputs
    `const float*`; the value converted is the same, and a `float*` passes where `const float*` is taken."""
    return argtype.replace("const ", "").strip()


def _namespaced(kernel: BundledKernel) -> tuple[list[str], str]:
    """The kernel's `#include` lines, and its source in namespace `trex_kernel_<index>` with C++ linkage."""
    includes, body = [], []
    for line in kernel.source.splitlines():
        (includes if line.startswith("#include") else body).append(line)
    code = _ENTRY.sub("void kernel(", "\n".join(body), count=1)
    return includes, f"namespace trex_kernel_{kernel.index} {{\n{code}\n}}  // namespace trex_kernel_{kernel.index}\n"


def _entry_point(kernel: BundledKernel) -> str:
    arguments = ", ".join(f"trex_argument<{_parsed_type(t)}>(args, {i})" for i, t in enumerate(kernel.argtypes))
    n = len(kernel.argtypes)
    return (
        f"static PyObject* trex_call_{kernel.index}(PyObject*, PyObject* args) {{\n"
        "    try {\n"
        f"        if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != {n})\n"
        f'            throw std::runtime_error("kernel_{kernel.index} takes a tuple of {n} arguments");\n'
        f"        trex_kernel_{kernel.index}::kernel({arguments});\n"
        "        Py_RETURN_NONE;\n"
        "    } catch (const std::exception& error) {\n"
        "        PyErr_SetString(PyExc_RuntimeError, error.what());\n"
        "        return nullptr;\n"
        "    }\n"
        "}\n"
    )


# The Python side of a bundle: argument conversion and the module's init. Tensors arrive as Python objects
# and are turned into data pointers by the function Dynamo exports for Inductor's own kernel bindings, whose
# address Inductor's loader puts in _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR before it imports the module.
_BINDING_PRELUDE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <type_traits>

static void* (*trex_tensor_data)(PyObject*) = nullptr;

template <typename T> static T trex_argument(PyObject* args, Py_ssize_t i) {
    PyObject* item = PyTuple_GET_ITEM(args, i);
    if constexpr (std::is_pointer_v<T>) {
        return static_cast<T>(trex_tensor_data(item));
    } else if constexpr (std::is_same_v<T, uintptr_t>) {
        void* value = PyLong_AsVoidPtr(item);
        if (value == nullptr && PyErr_Occurred()) throw std::runtime_error("an address argument is not an int");
        return reinterpret_cast<uintptr_t>(value);
    } else if constexpr (std::is_integral_v<T>) {
        long long value = PyLong_AsLongLong(item);
        if (value == -1 && PyErr_Occurred()) throw std::runtime_error("an integer argument is not an int");
        return static_cast<T>(value);
    } else {
        double value = PyFloat_AsDouble(item);
        if (value == -1.0 && PyErr_Occurred()) throw std::runtime_error("a float argument is not a number");
        return static_cast<T>(value);
    }
}
"""

_MODULE_INIT = """
static PyModuleDef trex_bundle_module = {PyModuleDef_HEAD_INIT, "kernel", nullptr, -1, trex_methods};

PyMODINIT_FUNC PyInit_kernel(void) {
    const char* address = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    if (address == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR is not set");
        return nullptr;
    }
    char* end = nullptr;
    errno = 0;
    uintptr_t value = std::strtoull(address, &end, 10);
    if (errno != 0 || end == address || value == 0) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR is not an address");
        return nullptr;
    }
    trex_tensor_data = reinterpret_cast<void* (*)(PyObject*)>(value);
    return PyModule_Create(&trex_bundle_module);
}
"""


def bundle_source(kernels: Sequence[BundledKernel]) -> str:
    """One translation unit: the kernels' includes once, each kernel in its namespace, one entry point each."""
    includes: list[str] = []
    bodies: list[str] = []
    for kernel in kernels:
        kernel_includes, body = _namespaced(kernel)
        includes += [line for line in kernel_includes if line not in includes]
        bodies.append(body)
    methods = "".join(f'    {{"kernel_{k.index}", trex_call_{k.index}, METH_VARARGS, nullptr}},\n' for k in kernels)
    return (
        "\n".join(includes)
        + "\n\n"
        + "\n".join(bodies)
        + _BINDING_PRELUDE
        + "\n".join(_entry_point(k) for k in kernels)
        + f"\nstatic PyMethodDef trex_methods[] = {{\n{methods}    {{nullptr, nullptr, 0, nullptr}}}};\n"
        + _MODULE_INIT
    )


def split_into_bundles(kernels: Sequence[BundledKernel], count: int) -> list[list[BundledKernel]]:
    """`count` groups of about equal source length (longest first, each to the lightest group): a kernel's
    build time grows with its source, and the bundles build in parallel on the compile threads."""
    groups: list[list[BundledKernel]] = [[] for _ in range(max(1, min(count, len(kernels))))]
    sizes = [0] * len(groups)
    for kernel in sorted(kernels, key=lambda k: len(k.source), reverse=True):
        lightest = sizes.index(min(sizes))
        groups[lightest].append(kernel)
        sizes[lightest] += len(kernel.source)
    return [sorted(group, key=lambda k: k.index) for group in groups if group]


@dataclass
class KernelBundler:
    """Collects the kernels of the wrapper modules Inductor loads inside `collecting`, and builds them in bundles.

    One bundler per compiled region: `lower` opens `collecting` around `compile_fx_inner`."""

    kernels: dict[tuple[tuple[str, ...], str], BundledKernel] = field(default_factory=dict)
    pending: list[BundledKernel] = field(default_factory=list)
    bundles: list[KernelBundle] = field(default_factory=list)
    unbundled: int = 0  # kernels Inductor built itself (see `bundleable`)
    failures: list[str] = field(default_factory=list)
    submit: Callable[[Callable[[], Any]], Any] | None = None  # the compile threads' pool (AsyncCompile.submit)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[KernelBundler]:
        """Inside: `AsyncCompile.cpp_pybinding` hands bundleable kernels to this bundler (module docstring);
        leaving it submits whatever is still collected, so a wait deferred past the compile
        (`kernel_builds`) finds its bundles building."""
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads
        from torch._inductor.codecache import LambdaFuture

        original = AsyncCompile.cpp_pybinding
        threads = get_compile_threads()

        def collect(async_compile: Any, argtypes: list[str], source_code: str) -> Any:
            if threads <= 1 or not bundleable(argtypes, source_code):
                self.unbundled += 1
                return original(async_compile, argtypes, source_code)
            if self.submit is None:
                self.submit = async_compile.submit
            key = (tuple(argtypes), source_code)
            kernel = self.kernels.get(key)
            if kernel is None:
                kernel = BundledKernel(tuple(argtypes), source_code, index=len(self.kernels))
                self.kernels[key] = kernel
                self.pending.append(kernel)
            return LambdaFuture(lambda: self._loaded(kernel, threads))

        AsyncCompile.cpp_pybinding = collect  # type: ignore[method-assign]
        try:
            yield self
        finally:
            AsyncCompile.cpp_pybinding = original  # type: ignore[method-assign]
            self._submit_pending(threads)

    def _submit_pending(self, threads: int) -> None:
        """Start the builds of every collected kernel not yet in a bundle (one bundle per compile thread)."""
        if not self.pending:
            return
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        pending, self.pending = self.pending, []
        for group in split_into_bundles(pending, threads):
            bundle = KernelBundle(group)
            for kernel in group:
                kernel.bundle = bundle
            try:
                bundle.get_module = CppPythonBindingsCodeCache.load_async(
                    bundle_source(group), "cpu", submit_fn=self.submit
                )
            except Exception as error:  # noqa: BLE001 - a bundle that cannot start falls back (docstring)
                self._fall_back(bundle, error)
            self.bundles.append(bundle)

    def _loaded(self, kernel: BundledKernel, threads: int) -> Callable[..., Any]:
        """The callable kernel: its bundle's entry point, once the bundle is built and loaded."""
        if kernel.bundle is None:
            self._submit_pending(threads)
        bundle = kernel.bundle
        assert bundle is not None
        if bundle.fallback is None and bundle.module is None:
            try:
                assert bundle.get_module is not None
                bundle.module = bundle.get_module()
            except Exception as error:  # noqa: BLE001 - build or load failure: build the kernels alone
                self._fall_back(bundle, error)
        if bundle.fallback is not None:
            return bundle.fallback[kernel.index]
        return getattr(bundle.module, f"kernel_{kernel.index}")

    def _fall_back(self, bundle: KernelBundle, error: Exception) -> None:
        """Build each kernel of a failed bundle by Inductor's own path, one library per kernel."""
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        failure = f"bundle of {len(bundle.kernels)} kernels: {type(error).__name__}: {error}"[:2000]
        self.failures.append(failure)
        warnings.warn(
            f"trex kernel bundles: a {failure}; building its kernels one by one instead (correct, slower cold "
            "compile). InductorBackend(kernel_bundles=False) skips bundling.",
            RuntimeWarning,
            stacklevel=2,
        )
        bundle.fallback = {
            k.index: CppPythonBindingsCodeCache.load_pybinding(list(k.argtypes), k.source) for k in bundle.kernels
        }

    def summary(self) -> str:
        """One line for the region's notes: how many kernels went into how many builds."""
        bundled = sum(len(b.kernels) for b in self.bundles)
        line = f"kernel bundles: {bundled} kernels built in {len(self.bundles)} C++ builds"
        if self.unbundled:
            line += f", {self.unbundled} built alone"
        if self.failures:
            line += f"; {len(self.failures)} bundle(s) failed and were built kernel by kernel: {self.failures[0]}"
        return line
