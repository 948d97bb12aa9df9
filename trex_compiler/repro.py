"""Reproducers: a failing pass's input graph and the pipeline from that pass on, written to disk and
replayed with `python repro.py`.

The pass manager knows nothing of files: the compile driver hands it `write_reproducer` (bound to the
dump directory), and `reproduce` re-runs a written folder through a fresh `PassManager`. So the
modules depend one way: repro -> pass_manager, passes, dump; never back.

A pass trex ships is found again by name. A user's pass is found by its module, or - when that
module is a script (`__main__`) or cannot be imported - from `user_passes.py`, written next to the
reproducer with the class's source and its file's top-level imports, so replaying never re-runs the
user's script.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from torch import fx

from trex.dump import graph_source
from trex.errors import TrexError
from trex.pass_manager import PassContext, PassManager, PipelineReport

USER_PASSES_FILE = "user_passes.py"


def _is_shipped(pass_: Any) -> bool:
    return type(pass_).__module__.startswith("trex.passes.")


def _module_importable(name: str) -> bool:
    if name == "__main__":
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _top_level_imports(source_file: str) -> list[str]:
    """The import statements at the top level of a user's file (what its pass class may refer to)."""
    try:
        tree = ast.parse(Path(source_file).read_text())
    except (OSError, SyntaxError):
        return []
    return [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]


def pass_locator(pass_: Any, folder: Path) -> dict[str, str]:
    """Where a pass can be found again. A user's pass class is also copied into
    `folder/user_passes.py` (with its file's imports): replaying tries the class's module first
    and falls back to that copy, so a pass from a script (`__main__`) or from a module only
    importable where it was defined (a test file) still replays, and no script is re-run."""
    entry: dict[str, Any] = {"name": pass_.name}
    if _is_shipped(pass_):
        settings = getattr(pass_, "reproducer_settings", None)  # a configured pass (a budget, a limit) replays as such
        if callable(settings):
            entry["settings"] = settings()
        return entry
    cls = type(pass_)
    entry.update(module=cls.__module__, qualname=cls.__qualname__)
    try:
        source = inspect.getsource(cls)
        source_file = inspect.getsourcefile(cls) or ""
    except (OSError, TypeError):
        if _module_importable(cls.__module__) and "<locals>" not in cls.__qualname__:
            return entry
        raise TrexError(
            f"pass {pass_.name!r} ({cls.__qualname__}) was defined where its source cannot be read (an interactive "
            "session?); define it in a file to get a reproducer"
        ) from None
    path = folder / USER_PASSES_FILE
    header = (
        "# the user's passes of this reproducer, with their file's imports\n"
        + "\n".join(_top_level_imports(source_file))
        + "\n"
    )
    existing = path.read_text() if path.exists() else header
    path.write_text(existing + "\n\n" + textwrap.dedent(source) + "\n")
    entry.update(copy=USER_PASSES_FILE, copy_name=cls.__name__)
    return entry


def write_reproducer(gm: fx.GraphModule, pipeline: list[Any], ctx: PassContext, directory: str | Path | None) -> Path:
    """Write a failing pass's input graph and the pipeline from that pass on; return the folder."""
    base = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="trex-repro-"))
    first = pipeline[0].name
    folder = base / f"repro_graph_{ctx.graph_id}_{ctx.phase}_{first}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / USER_PASSES_FILE).unlink(missing_ok=True)
    (folder / "graph.py").write_text(
        graph_source(gm, [f"trex reproducer: input of pass {first!r} on graph {ctx.graph_id} ({ctx.phase})"])
    )
    (folder / "pipeline.txt").write_text(",".join(p.name for p in pipeline) + "\n")
    (folder / "pipeline.json").write_text(json.dumps([pass_locator(p, folder) for p in pipeline], indent=1) + "\n")
    (folder / "repro.py").write_text(
        '"""Re-run the failing pipeline on the saved graph: python repro.py"""\n'
        "from pathlib import Path\n\n"
        "from trex.repro import reproduce\n\n"
        f"reproduce(Path(__file__).parent, target={ctx.target!r}, phase={ctx.phase!r})\n"
    )
    return folder


def load_dumped_graph(path: str | Path) -> tuple[fx.GraphModule, list[Any]]:
    """Load a dumped `.py` graph back as an fx GraphModule with FakeTensor metadata, plus its inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"trex_dump_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gm = fx.symbolic_trace(module.build())
    inputs = module.example_inputs()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*inputs)
    return gm, inputs


def _load_pass_class(entry: dict[str, str], folder: Path) -> type:
    """A user's pass class: from its module when that imports here (never `__main__`), else from
    the copy in `user_passes.py` beside the reproducer."""
    if entry["module"] != "__main__" and "<locals>" not in entry["qualname"]:
        try:
            target: Any = importlib.import_module(entry["module"])
            for part in entry["qualname"].split("."):
                target = getattr(target, part)
            return target
        except (ImportError, AttributeError):
            pass
    if "copy" not in entry:
        raise TrexError(
            f"cannot import pass {entry['name']!r} from module {entry['module']!r}, and the reproducer holds no copy of it"
        )
    spec = importlib.util.spec_from_file_location("trex_repro_user_passes", folder / entry["copy"])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, entry["copy_name"])


def load_pipeline(folder: str | Path) -> list[Any]:
    """The passes of a reproducer, each built as it was configured (`reproducer_settings`)."""
    from trex.passes import resolve_pipeline

    pipeline = []
    for entry in json.loads((Path(folder) / "pipeline.json").read_text()):
        if "qualname" in entry:
            pipeline.append(_load_pass_class(entry, Path(folder))())
        elif "settings" in entry:
            pipeline.append(type(resolve_pipeline([entry["name"]])[0])(**entry["settings"]))
        else:
            pipeline.append(resolve_pipeline([entry["name"]])[0])
    return pipeline


def reproduce(folder: str | Path, *, target: str = "cpu", phase: str = "joint") -> PipelineReport:
    """Re-run a reproducer written by a failing pipeline."""

    folder = Path(folder)
    gm, _ = load_dumped_graph(folder / "graph.py")
    pipeline = load_pipeline(folder)
    again = folder / "again"
    manager = PassManager(pipeline, reproducer=lambda g, remaining, ctx: write_reproducer(g, remaining, ctx, again))
    return manager.run(gm, PassContext(target=target, phase=phase))
