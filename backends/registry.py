"""Where backends are found by name: the built-in ones, `trex.register_backend`, and the
`trex.backends` entry-point group (so a pip-installed plugin needs no import by the user).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable

from trex.backends.backend import Backend
from trex.backends.eager import EagerBackend
from trex.backends.inductor import InductorBackend, inductor_unavailable_reason
from trex.errors import BackendError, UnknownNameError

ENTRY_POINT_GROUP = "trex.backends"
ENVIRONMENT_VARIABLE = "TREX_BACKENDS"

_BUILTIN: dict[str, Callable[[], Backend]] = {EagerBackend.name: EagerBackend, InductorBackend.name: InductorBackend}


def default_backend_names() -> list[str]:
    """The backends `trex.compile` uses when neither `backend=` nor TREX_BACKENDS says: Inductor
    where it can compile (torch._inductor imports, a C++ compiler is on PATH), eager for the rest."""
    return ["eager"] if inductor_unavailable_reason() is not None else ["inductor", "eager"]


def backend_names_from_env(environ: dict[str, str]) -> list[str] | None:
    """TREX_BACKENDS="inductor,eager" (priority order), or None when unset or empty."""
    value = environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not value:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    known = available_backends()
    for name in names:
        if name not in known:
            raise UnknownNameError("backend", name, known, hint=f"set by {ENVIRONMENT_VARIABLE}={value!r}")
    return names


_registered: dict[str, Callable[[], Backend]] = {}


def register_backend(backend: type[Backend] | Backend, *, replace: bool = False):
    """Make a backend available by its `name`. Usable as a class decorator; returns its argument."""
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name:
        raise BackendError(f"{backend!r} has no `name`; a backend declares `name: ClassVar[str] = '...'`")
    for method in ("supports", "lower"):
        if not callable(getattr(backend, method, None)):
            raise BackendError(f"backend {name!r} has no `{method}` method; see trex.backends.Backend")
    if name in _BUILTIN:
        raise BackendError(f"backend name {name!r} is reserved for trex's built-in backend; choose another name")
    if name in _registered and not replace:
        raise BackendError(f"a backend named {name!r} is already registered; pass replace=True to replace it")
    _registered[name] = backend if isinstance(backend, type) else (lambda: backend)
    return backend


def unregister_backend(name: str) -> None:
    _registered.pop(name, None)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_backends() -> list[str]:
    return sorted({*_BUILTIN, *_registered, *_entry_points()})


def get_backend(spec: str | Backend) -> Backend:
    """A backend instance from a name (built-in, registered, or entry point) or an instance."""
    if isinstance(spec, Backend) or (
        not isinstance(spec, str) and hasattr(spec, "supports") and hasattr(spec, "lower")
    ):
        return spec
    if not isinstance(spec, str):
        raise BackendError(f"a backend is given by name or instance, not {type(spec).__name__}")
    factory = _BUILTIN.get(spec) or _registered.get(spec)
    if factory is None:
        entry_point = _entry_points().get(spec)
        if entry_point is None:
            raise UnknownNameError(
                "backend",
                spec,
                available_backends(),
                hint="register one with trex.register_backend or the 'trex.backends' entry-point group",
            )
        try:
            factory = entry_point.load()
        except Exception as error:  # noqa: BLE001 - a broken plugin must not look like a missing one
            raise BackendError(
                f"backend {spec!r} (entry point {entry_point.value}) failed to import: {error}"
            ) from error
    # a class or a zero-argument factory is called; an instance is used as it is
    backend = factory() if isinstance(factory, type) or not hasattr(factory, "supports") else factory
    if getattr(backend, "name", None) != spec:
        raise BackendError(
            f"backend registered as {spec!r} calls itself {getattr(backend, 'name', None)!r}; the names must match"
        )
    return backend
