"""`trex capture MODEL`: capture a model's graphs and print what was captured.

With `--meta`, the model is built on the meta device (no weights) and each distinct decoder-layer
kind is captured once: this is how full-size models (DeepSeek-V4-Flash, 284B) are captured for
planning on a laptop. Without it, the model is built with random weights on the CPU and captured
whole by `trex.compile` with one real training step, which only makes sense for small models.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trex.errors import TrexError

# Without --meta the model is materialized: refuse anything that would not fit comfortably.
MATERIALIZE_LIMIT_FRACTION = 0.5


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "capture",
        help="capture a model's graphs (full-size models with --meta)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        help="built-in name (see --list), tiny-<family>, or a path to a transformers config.json",
    )
    parser.add_argument(
        "--meta", action="store_true", help="build on the meta device and capture one graph per distinct layer kind"
    )
    parser.add_argument(
        "--dump", metavar="DIR", type=Path, help="write every graph after every pass, and the decisions, here"
    )
    parser.add_argument(
        "--seq",
        type=int,
        default=4096,
        help="sequence length of the captured step (default 4096 with --meta, 16 otherwise)",
    )
    parser.add_argument("--batch", type=int, default=1, help="micro-batch size of the captured step (default 1)")
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="parameter dtype (default bfloat16)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--list", action="store_true", help="list the built-in model names and exit")
    parser.add_argument(
        "--fallback",
        choices=("eager",),
        help="without --meta: run a model with graph breaks region by region instead of failing",
    )
    parser.add_argument(
        "--allow-dense", action="store_true", help="capture a model without mixture-of-experts layers anyway"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trex.models import MODELS, TINY_PREFIX, model_names

    if args.list:
        for name in model_names():
            entry = MODELS.get(name)
            kind = (
                "tiny, random init"
                if name.startswith(TINY_PREFIX)
                else ("capture with --meta" if entry.capturable else "priced only")
            )
            print(f"{name:20} {kind}")
        return 0
    if args.model is None:
        raise TrexError(
            "name a MODEL to capture (a built-in name, tiny-<family> or a config.json); `trex capture --list` lists the names"
        )
    if args.seq <= 0 or args.batch <= 0:
        raise TrexError(f"--seq and --batch must be positive (got --seq {args.seq}, --batch {args.batch})")
    if args.dump is not None:
        from trex.outputs import output_dir

        output_dir(args.dump, "--dump")
    from trex.cli.progress import progress_printer

    args.say = progress_printer("capture", args.quiet or args.json)
    _check_moe(args)
    if args.meta:
        return _run_meta(args)
    return _run_materialized(args)


def _check_moe(args: argparse.Namespace) -> None:
    """trex captures MoE models; a dense one is refused unless asked for (--allow-dense)."""
    from trex.models import MODELS, TINY_PREFIX, is_moe_config, load_config, read_config_dict

    name = str(args.model)
    if name.startswith(TINY_PREFIX) or name in MODELS:
        load_config(name)  # a priced-only name says so here
        return
    load_config(name)  # unknown names, unknown or priced-only model types are refused with what works
    data = read_config_dict(name)
    if not is_moe_config(data) and not args.allow_dense:
        raise TrexError(
            f"{name}: model_type {data['model_type']!r} has no mixture-of-experts layers (none of n_routed_experts, num_experts, "
            "num_local_experts is set); trex's capture is built for MoE models. Pass --allow-dense to capture it anyway"
        )


def _run_meta(args: argparse.Namespace) -> int:
    import torch

    from trex.meta_capture import ENDS, capture_model

    args.say(f"capturing {args.model} on the meta device, one graph per distinct layer kind")
    capture = capture_model(
        args.model, batch=args.batch, seq=args.seq, dtype=getattr(torch, args.dtype), dump_dir=args.dump
    )
    if args.json:
        print(json.dumps(_meta_json(capture), indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)  # pipes and logs keep whole rows
    table = Table(
        title=f"{capture.model}: {capture.num_layers} decoder layers in {sum(k.name != ENDS for k in capture.kinds)} kinds (batch {capture.batch}, seq {capture.seq}, {args.dtype}, meta device)"
    )
    for column in (
        "layer kind",
        "count",
        "layers",
        "dynamo nodes",
        "joint nodes",
        "fwd / bwd nodes",
        "params / layer",
        "active / layer",
        "capture s",
    ):
        table.add_column(column, justify="left" if column in ("layer kind", "layers") else "right")
    for kind in capture.kinds:
        nodes = kind.node_counts()
        table.add_row(
            kind.name,
            str(kind.count) if kind.name != ENDS else "1",
            _ranges(kind.layer_indices) if kind.layer_indices else "first/last stage",
            str(nodes.get("dynamo", "")),
            str(nodes.get("joint", "")),
            f"{nodes.get('forward', '')} / {nodes.get('backward', '')}",
            _billions(kind.params_per_layer),
            _billions(kind.active_params_per_layer),
            f"{kind.seconds:.1f}",
        )
    console.print(table)
    console.print(
        f"total parameters {_billions(capture.total_params)}, active per token {_billions(capture.active_params)}"
    )
    console.print(
        f"time: build {capture.seconds['build']:.1f} s, meta run {capture.seconds['meta_run']:.1f} s, capture {capture.seconds['capture']:.1f} s, total {capture.seconds['total']:.1f} s"
    )
    if args.dump:
        console.print(f"dumps written to {args.dump.resolve()}")
    return 0


def _meta_json(capture) -> dict:
    return {
        "model": capture.model,
        "batch": capture.batch,
        "seq": capture.seq,
        "total_params": capture.total_params,
        "active_params": capture.active_params,
        "num_layers": capture.num_layers,
        "seconds": capture.seconds,
        "kinds": [
            {
                "name": k.name,
                "count": k.count,
                "layers": k.layer_indices,
                "nodes": k.node_counts(),
                "params_per_layer": k.params_per_layer,
                "active_params_per_layer": k.active_params_per_layer,
                "seconds": k.seconds,
            }
            for k in capture.kinds
        ],
    }


def _run_materialized(args: argparse.Namespace) -> int:
    import os

    import torch

    import trex
    from trex.meta_capture import parameter_counts
    from trex.models import TESTED_FAMILIES, build_model, load_config

    config = load_config(args.model)
    meta_model = build_model(config, device="meta")
    total, active = parameter_counts(meta_model)
    bytes_needed = total * torch.finfo(getattr(torch, args.dtype)).bits // 8 * 4  # weights, grads, 2 AdamW states
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if bytes_needed > MATERIALIZE_LIMIT_FRACTION * memory:
        raise TrexError(
            f"{args.model} has {_billions(total)} parameters: a training step needs ~{bytes_needed / 2**30:.0f} GiB, "
            f"this machine has {memory / 2**30:.0f} GiB; capture it on the meta device with `trex capture {args.model} --meta`"
        )
    seq = args.seq if args.seq != 4096 else 16
    args.say(f"building {args.model} with random weights ({_billions(total)} parameters)")
    model = build_model(config, dtype=getattr(torch, args.dtype))
    compiled = trex.compile(model, dump_dir=args.dump, fallback=args.fallback, progress=args.say)
    input_ids = torch.randint(0, config.vocab_size, (args.batch, seq))
    args.say("one training step: Dynamo capture, AOTAutograd joint trace, passes, lowering")
    try:
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    except trex.CaptureError as error:
        raise TrexError(
            f"{error}\ntrex captures whole the MoE families it is tested on ({', '.join(TESTED_FAMILIES)}); "
            f"run this model region by region with `trex capture {args.model} --fallback eager`"
        ) from None
    loss.backward()
    session = compiled.trex
    if args.json:
        print(
            json.dumps(
                {
                    "model": args.model,
                    "batch": args.batch,
                    "seq": seq,
                    "total_params": total,
                    "active_params": active,
                    "loss": loss.item(),
                    "graphs": [
                        {
                            "graph": g.graph_id,
                            "phase": g.phase,
                            "dynamo_nodes": len(g.dynamo_graph.graph.nodes),
                            "joint_nodes": len(g.joint.graph.nodes) if g.joint is not None else None,
                            "seconds": g.seconds,
                        }
                        for g in session.graphs
                    ],
                    "graph_breaks": len(session.graph_breaks),
                    "first_call_seconds": session.first_call_seconds,
                },
                indent=2,
            )
        )
        return 0
    print(session.summary())
    for graph in session.graphs:
        print(graph.report.summary())
    print(
        f"parameters {_billions(total)}, active per token {_billions(active)}; one training step: loss {loss.item():.4f}"
    )
    return 0


def _billions(count: int) -> str:
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    if count >= 1e6:
        return f"{count / 1e6:.2f}M"
    return f"{count / 1e3:.1f}K"


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2] -> '0-2'; [3, 5, ..., 41] -> '3-41 step 2 (20 layers)'; otherwise runs joined by commas."""
    if len(indices) > 2:
        steps = {b - a for a, b in zip(indices, indices[1:])}
        if len(steps) == 1:
            step = steps.pop()
            return (
                f"{indices[0]}-{indices[-1]}"
                if step == 1
                else f"{indices[0]}-{indices[-1]} step {step} ({len(indices)} layers)"
            )
    parts, start = [], 0
    for position in range(1, len(indices) + 1):
        if position == len(indices) or indices[position] != indices[position - 1] + 1:
            run = indices[start:position]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            start = position
    text = ", ".join(parts)
    return text if len(text) <= 40 else f"{indices[0]}..{indices[-1]} ({len(indices)} layers)"
