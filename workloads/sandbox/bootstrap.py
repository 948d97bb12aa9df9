"""Sandbox bootstrap: the `__main__` of the sandboxed interpreter; runs one program.

    python -I -B bootstrap.py CONFIG_JSON

In order: open the events channel (an inherited file descriptor), install the solver recorders,
read and compile the program, load the seccomp filter (when asked), install the guard, then run
the program as `__main__` with `sys.argv == ["program.py"]`. The warm worker (`worker.py`)
runs programs through the same `run_program`. An uncaught exception is printed like Python would and reported as
an `exception` event (type, errno, message) so the evaluator can tell a MemoryError from a
failed fork from an ordinary bug without parsing tracebacks.

Runs inside the sandbox: standard library only; siblings are loaded by path.
"""

from __future__ import annotations

import json
import os
import sys


def _load_sibling(name: str):
    if f"_trex_sandbox_{name}" in sys.modules:  # loaded already (the warm worker loads them before forking)
        return sys.modules[f"_trex_sandbox_{name}"]
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_trex_sandbox_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Events:
    """JSON lines on an inherited descriptor. Never raises: a program may have closed it."""

    MAX_EVENT_BYTES = 16_384

    def __init__(self, fd: int):
        self._fd = fd
        self._write = os.write
        self._dumps = json.dumps

    def emit(self, event: dict) -> None:
        try:
            line = self._dumps(event, default=str)
            if len(line) > self.MAX_EVENT_BYTES:
                line = self._dumps({"event": event.get("event"), "truncated": True})
            self._write(self._fd, (line + "\n").encode())
        except Exception:  # noqa: BLE001
            pass


def _exception_event(error: BaseException) -> dict:
    event = {"event": "exception", "type": type(error).__name__, "message": str(error)[:2000]}
    errno = getattr(error, "errno", None)
    if isinstance(errno, int):
        event["errno"] = errno
    kind = getattr(error, "kind", None)
    if isinstance(kind, str):
        event["violation"] = kind
    return event


def main() -> int:
    config = json.loads(sys.argv[1])
    events = _Events(config["events_fd"])
    with open(config["program"], encoding="utf-8", errors="replace") as program:
        source = program.read()
    confine = None
    if config.get("seccomp"):
        seccomp_filter = _load_sibling("seccomp_filter")
        confine = seccomp_filter.build((os.getppid(),)).load
    return run_program(source, events, config, confine=confine)


def run_program(source: str, events: _Events, config: dict, *, confine=None) -> int:
    """Record solves, compile, confine (seccomp, when given), guard, then run `source` as
    `__main__`. Returns the exit status; a `SystemExit` of the program propagates."""
    if config["record_solvers"]:
        _load_sibling("recorders").install(events.emit)
    try:
        code = compile(source, "program.py", "exec")
    except (SyntaxError, ValueError) as error:
        events.emit({"event": "syntax_error", "message": str(error), "line": getattr(error, "lineno", None)})
        import traceback

        traceback.print_exception(error, limit=0)
        return 1

    if confine is not None:
        import traceback  # noqa: F401 - loaded before the filter, like everything the failure path needs

        confine()
    if config["guard"]:
        policy = _load_sibling("policy").PathPolicy.from_json(config["policy"])
        import ctypes  # noqa: F401 - imported before the guard: ctypes resolves its own libpython

        _load_sibling("guard").install(policy, events.emit, allow_fork=config["allow_fork"])

    import types

    main_module = types.ModuleType("__main__")
    main_module.__file__ = "program.py"
    main_module.__builtins__ = __builtins__
    sys.modules["__main__"] = main_module
    sys.argv = ["program.py"]
    try:
        exec(code, main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - report, then fail like the program would
        events.emit(_exception_event(error))
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - e.g. MemoryError while formatting
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
