"""The options `trex estimate` and `trex plan` share, with one set of defaults.

Both describe the same training run (model, cluster, devices, sequence, global batch, precision,
software settings), so a plan found by `trex plan` is priced by `trex estimate` with the same
numbers when the user leaves the defaults alone. `--help` shows every default.
"""

from __future__ import annotations

import argparse

from trex.cost_model.catalog import cluster_names

DEFAULT_SEQ = 4096
DEFAULT_GBS = 1024
DEFAULT_PRECISION = "bf16"
PRECISIONS = ("bf16", "fp16", "fp8", "fp32")


def add_training_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """--model --cluster --devices --device --seq --gbs --precision, as both commands take them."""
    parser.add_argument(
        "--model",
        required=required,
        help="built-in model (e.g. deepseek-v4-pro, deepseek-v3, gpt-175b; `trex capture --list`) or a transformers config.json",
    )
    parser.add_argument(
        "--cluster", required=required, help=f"named cluster ({', '.join(cluster_names())}) or a TOML/JSON cluster file"
    )
    parser.add_argument(
        "--devices", type=int, required=required, help="number of devices (accelerators, or dies on Ascend 910C)"
    )
    parser.add_argument(
        "--device", help="override the cluster's device profile (a built-in name or a TOML/JSON profile)"
    )
    parser.add_argument("--seq", type=int, default=DEFAULT_SEQ, help=f"sequence length (default {DEFAULT_SEQ})")
    parser.add_argument(
        "--gbs", type=int, default=DEFAULT_GBS, help=f"global batch size in sequences (default {DEFAULT_GBS})"
    )
    parser.add_argument(
        "--precision",
        default=DEFAULT_PRECISION,
        choices=PRECISIONS,
        help=f"training precision (default {DEFAULT_PRECISION})",
    )


def check_sizes(args: argparse.Namespace) -> None:
    """Positive device count, sequence length and batch, before any pricing."""
    from trex.errors import TrexError

    for option in ("devices", "seq", "gbs", "mbs"):
        value = getattr(args, option, None)
        if value is not None and value <= 0:
            raise TrexError(f"--{option} {value}: must be a positive integer")
