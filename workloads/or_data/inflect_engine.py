"""The `inflect` library, imported without typeguard's per-import recompilation.

inflect decorates its engine's methods with typeguard's `@typechecked`, which re-parses and
recompiles inflect's source every time the module is imported (about 2 s of CPU here, paid by the
CLI and again by every synthesis worker process) and then checks argument types on every call
(about 5 ms of CPU per generated sample). typeguard makes the decorator a no-op under `python -O`;
this does the same for inflect's import only, so the functions are inflect's own, unchanged, and
the results are identical.
"""

from __future__ import annotations

import sys


def _import_inflect():
    if "inflect" in sys.modules:
        return sys.modules["inflect"]
    try:
        import typeguard
    except ImportError:  # an inflect that no longer uses it
        import inflect

        return inflect
    original = typeguard.typechecked

    def unchecked(target=None, **_options):
        return (lambda function: function) if target is None else target

    typeguard.typechecked = unchecked
    try:
        import inflect
    finally:
        typeguard.typechecked = original
    return inflect


inflect = _import_inflect()
