"""Dumps: the graph after every pass as readable, runnable Python, and every decision as JSON lines.

Layout of a dump directory (`TREX_DUMP=dir` or `trex.compile(..., dump_dir=dir)`):

    dir/graph_0_joint/000_capture.py                   the graph as captured
    dir/graph_0_joint/001_canonicalize_moe.py          after pass 1 (header: pass, time, node delta)
    dir/graph_0_joint/001_canonicalize_moe.decisions.jsonl
    dir/graph_0_joint/forward.py, backward.py          the partitioned graphs that run
    dir/graph_0_joint/lowering.txt                     which backend runs which nodes
    dir/graph_0_joint/summary.txt                      the pipeline report
    dir/.trex_manifest                                 the files trex wrote (nothing else is ever removed)

Each `.py` file runs on its own (`python 001_canonicalize_moe.py`) with random inputs of the
recorded shapes and dtypes (integer inputs are zeros, so every index is valid), and imports
cleanly so a test or a diff tool can load `GraphModule` from it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from trex.graph_copy import copy_graph_module

if TYPE_CHECKING:
    from trex.pass_manager import PassContext, PassRecord

MANIFEST = ".trex_manifest"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype)  # "torch.float32"


def _example_int(value: int | torch.SymInt) -> int:
    """A size's example value: the int, or a SymInt's hint. An unbacked SymInt (a data-dependent size, such as the
    rows an expert-parallel rank receives) has no hint: the smallest value its range allows (0 if unbounded)."""
    if isinstance(value, int):
        return value
    if value.node.hint is not None:
        return int(value.node.hint)
    lower = value.node.shape_env.bound_sympy(value.node.expr).lower
    return max(0, int(lower)) if getattr(lower, "is_Integer", False) else 0


def _input_spec(node: fx.Node) -> str:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        shape = tuple(_example_int(s) for s in value.shape)
        return f"({node.name!r}, {shape!r}, {_dtype_name(value.dtype)})"
    if isinstance(value, (int, torch.SymInt)):
        return f"({node.name!r}, {_example_int(value)!r}, 'int')"
    return f"({node.name!r}, None, None)"


_RUNNER = '''

def example_inputs():
    """Inputs of the recorded shapes: random floats, zeros for integers (valid indices), False for bools."""
    generator = torch.Generator().manual_seed(0)
    values = []
    for _name, shape, dtype in INPUTS:
        if dtype == "int":
            values.append(shape)
        elif dtype is None:
            values.append(None)
        elif dtype.is_floating_point or dtype.is_complex:
            values.append(torch.randn(shape, generator=generator).to(dtype))
        else:
            values.append(torch.zeros(shape, dtype=dtype))
    return values


def build():
    module = {class_name}()
    for name, shape, dtype in CONSTANTS:
        setattr(module, name, torch.zeros(shape, dtype=dtype))
    return module


if __name__ == "__main__":
    outputs = build()(*example_inputs())
    outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    for index, value in enumerate(outputs):
        if isinstance(value, torch.Tensor):
            print(index, tuple(value.shape), value.dtype)
'''


def graph_source(gm: fx.GraphModule, header_lines: list[str]) -> str:
    """Python source of `gm` that imports, runs on random inputs, and names where it came from."""
    gm = copy_graph_module(gm, flat_signature=True)
    class_code = gm.print_readable(print_output=False, include_stride=False, include_device=False)
    class_name = re.match(r"class (\w+)\(", class_code.lstrip()).group(1)
    inputs = ",\n    ".join(_input_spec(n) for n in gm.graph.find_nodes(op="placeholder"))
    constants = []
    for node in gm.graph.find_nodes(op="get_attr"):
        value = getattr(gm, node.target, None)
        if isinstance(value, torch.Tensor):
            constants.append(f"({node.target!r}, {tuple(value.shape)!r}, {_dtype_name(value.dtype)})")
    header = "\n".join(f"# {line}" for line in header_lines)
    return (
        f"{header}\n"
        "import torch\n"
        "from torch import device, inf, nan  # noqa: F401 - names the generated code may use\n\n"
        "import trex.ops  # noqa: F401 - registers torch.ops.trex\n\n\n"
        f"{class_code.strip()}\n\n\n"
        f"INPUTS = [\n    {inputs}\n]\n"
        f"CONSTANTS = [{', '.join(constants)}]  # zero-filled stand-ins for the graph's tensor constants\n"
        + _RUNNER.replace("{class_name}", class_name)
    )


@dataclass
class DumpWriter:
    """Writes one compile's dumps under `root`, never touching files it did not write."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._written: set[str] = set()
        self.foreign_files = self._remove_previous_dump()
        self._foreign = set(self.foreign_files)

    def _remove_previous_dump(self) -> list[str]:
        """Delete the files a previous trex run listed in the manifest; return the foreign ones."""
        manifest = self.root / MANIFEST
        ours = set(manifest.read_text().split("\n")) if manifest.exists() else set()
        for name in ours:
            path = self.root / name
            if name and path.is_file():
                path.unlink()
        for directory in sorted({(self.root / n).parent for n in ours if n}, key=lambda p: len(p.parts), reverse=True):
            if directory != self.root and directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file() and p.name != MANIFEST)

    def graph_dir(self, ctx: PassContext) -> Path:
        return self.root / f"graph_{ctx.graph_id}_{ctx.phase}"

    def write_text(self, relative: str | Path, text: str) -> Path:
        if str(Path(relative)) in self._foreign:
            from trex.outputs import OutputPathError

            raise OutputPathError(
                f"dump directory {self.root}: {relative} is there and trex did not write it; trex never overwrites "
                "files it did not write: move it away or choose another dump directory (dump_dir= / TREX_DUMP / --dump)"
            )
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self._written.add(str(Path(relative)))
        (self.root / MANIFEST).write_text("\n".join(sorted(self._written)) + "\n")
        return path

    def write_graph(
        self,
        gm: fx.GraphModule,
        ctx: PassContext,
        *,
        index: int,
        title: str,
        record: PassRecord | None = None,
        header: dict[str, Any] | None = None,
    ) -> Path:
        directory = self.graph_dir(ctx).relative_to(self.root)
        lines = [f"trex dump: graph {ctx.graph_id} ({ctx.phase}), step {index:03d}: {title}"]
        if record is not None:
            lines.append(
                f"pass {record.name}: took {record.seconds * 1e3:.1f} ms; nodes {record.nodes_before} -> {record.nodes_after} ({record.node_delta:+d}); modified={record.modified}; decisions={len(record.decisions)}"
            )
        else:
            lines.append(f"captured graph: {len(gm.graph.nodes)} nodes")
        for key, value in (header or {}).items():
            lines.append(f"{key}: {value}")
        lines.append("run: python <this file>   (random inputs of the recorded shapes)")
        path = self.write_text(directory / f"{index:03d}_{title}.py", graph_source(gm, lines))
        if record is not None:
            decisions = "".join(json.dumps(d.to_json(record.name), default=str) + "\n" for d in record.decisions)
            self.write_text(directory / f"{index:03d}_{title}.decisions.jsonl", decisions)
        return path

    def write_module(self, gm: fx.GraphModule, ctx: PassContext, name: str, header_lines: list[str]) -> Path:
        directory = self.graph_dir(ctx).relative_to(self.root)
        return self.write_text(directory / f"{name}.py", graph_source(gm, header_lines))
