"""`trex train --zero3 graph` and `--ep-chunks`: the plans reorder_comm schedules, run by the trainer.

Default run: one start of 2 gloo ranks trains tiny Qwen3-MoE with ZeRO-3 inside the graph (eager) and with ep=2
in 2 micro-chunks per EP layer (eager); both give the 1-rank run's losses and gradients. Slow: the same with
`--compile` (reorder_comm in the pipeline) over an emulated link, with the cost model choosing the chunks.
"""

from __future__ import annotations

import argparse

import pytest
from test_distributed_equivalence import SHAPE, STEPS, assert_same_run, reference

from trex.errors import TrexError
from trex.runtime.launcher import launch_function, run_jobs
from trex.runtime.trainer import TrainJob

MODEL = "tiny-qwen3-moe"


def job(plan: str, **fields) -> TrainJob:
    return TrainJob.create(MODEL, plan, 2, **SHAPE, steps=STEPS, gather_gradients=True, verbose=False, **fields)


def test_zero3_in_graph_and_ep_micro_chunks_match_the_one_rank_run():
    ref = reference(MODEL)
    jobs = [job("zero=3", zero3="graph"), job("ep=2", ep_chunks="2")]
    zero3, ep = launch_function(run_jobs, (jobs,), 2)[0]
    assert_same_run(zero3, ref, "zero=3 in the graph")
    assert any("zero=3 inside the graph" in note for note in zero3["notes"]), zero3["notes"]
    assert_same_run(ep, ref, "ep=2 in 2 micro-chunks")
    chunk_notes = [note for note in ep["notes"] if note.startswith("ep micro-chunks")]
    assert chunk_notes and all(": 2 (set by --ep-chunks)" in note for note in chunk_notes), ep["notes"]


@pytest.mark.slow
def test_compiled_zero3_in_graph_and_chunked_ep_over_an_emulated_link_match():
    """With --compile the collectives are graph nodes (reorder_comm reschedules them); the cost model picks each EP
    layer's chunks on the emulated link; losses and gradients stay the 1-rank run's."""
    ref = reference(MODEL)
    link = "alpha_us=50,gbps=0.001"
    jobs = [
        job("zero=3", zero3="graph", compile=True, emulate_link=link),
        job("ep=2", compile=True, emulate_link=link),
    ]
    zero3, ep = launch_function(run_jobs, (jobs,), 2)[0]
    assert_same_run(zero3, ref, "zero=3 in the graph, compiled")
    ops = zero3["captured_ops"]
    assert any("all_gather" in name for name in ops) and any("reduce_scatter" in name for name in ops), ops
    assert_same_run(ep, ref, "ep=2 compiled, chunks chosen by the cost model")
    chunks = [note for note in ep["notes"] if note.startswith("ep micro-chunks")]
    assert chunks and all("dispatch" in note and "chunk" in note for note in chunks), ep["notes"]


def cli_args(**overrides) -> argparse.Namespace:
    from trex.runtime.cli import add_training_flags

    parser = argparse.ArgumentParser()
    add_training_flags(parser)
    args = parser.parse_args(["--model", MODEL, "--nproc", "2", "--seq", "16"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"plan": "zero=1", "zero3": "graph"}, "the plan has zero=1; add zero=3"),
        ({"plan": "zero=3,ep=2", "zero3": "graph"}, "ep=2 (use --zero3 fsdp2"),
        ({"plan": "ep=2", "ep_chunks": "0"}, "--ep-chunks must be 'auto' or a positive integer"),
        ({"plan": "zero=3", "compile": True}, "--compile cannot capture zero=3 through FSDP2"),
        ({"plan": "zero=3,ep=2", "compile": True}, "use --zero3 graph"),
        ({"plan": "ep=2", "ep_chunks": "many"}, "--ep-chunks must be 'auto' or a positive integer"),
    ],
)
def test_bad_overlap_options_are_refused_before_any_rank_starts(overrides, message):
    from trex.runtime.cli import build_job

    with pytest.raises(TrexError, match=message.replace("(", r"\(")):
        build_job(cli_args(**overrides))


def test_zero3_in_graph_refuses_checkpoints_with_the_fix(tmp_path):
    from trex.runtime.cli import build_job

    with pytest.raises(TrexError, match="--zero3 fsdp2"):
        build_job(cli_args(plan="zero=3", zero3="graph", checkpoint_dir=tmp_path / "c", save_every=1))
