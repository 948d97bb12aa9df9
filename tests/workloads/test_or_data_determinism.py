"""The samples of a seed do not depend on the machine's speed or load: no clock decides a verdict.

In-process solves are bounded by node counts, never by time; a program the pipeline wrote that ends
on a sandbox clock limit is run again with larger clocks, and when it keeps ending on one the run
stops with nothing recorded (a rerun resumes), instead of a rejection that an idle machine would not
make. Nothing here measures time: the slow machine is
simulated by the sandbox reporting a clock limit, and the node limit is reached by a model that
needs more nodes than it is given.
"""

from __future__ import annotations

import math
import random

import pytest

from trex.workloads.or_data import solve
from trex.workloads.or_data.config import SynthConfig
from trex.workloads.or_data.families import FAMILIES
from trex.workloads.or_data.linear_model import LinearModel, Row, Variable
from trex.workloads.or_data.lp_format import write_lp
from trex.workloads.or_data.pipeline import ShardContext, synthesize_shard
from trex.workloads.or_data.program_runner import ClockLimitReached, ProgramRunner
from trex.workloads.or_data.synthesis import synthesize
from trex.workloads.sandbox import FailureKind, Limits, Sandbox
from trex.workloads.sandbox.execution import Execution

OUTPUTS = ("sft.jsonl", "cpt.jsonl")


def market_split(seed: int = 7, rows: int = 3, columns: int = 30) -> LinearModel:
    """Cornuéjols & Dawande's market split: equality knapsacks with half the row sums on the right.
    Branch and bound needs far more than a few nodes to settle one of these."""
    rng = random.Random(seed)
    variables = tuple(Variable(f"x{j}", "binary", 0.0, 1.0) for j in range(columns))
    constraints = []
    for i in range(rows):
        coefficients = [rng.randint(0, 99) for _ in range(columns)]
        constraints.append(
            Row(
                f"split{i}",
                tuple((f"x{j}", float(c)) for j, c in enumerate(coefficients)),
                "==",
                sum(coefficients) // 2,
            )
        )
    objective = tuple((f"x{j}", float(rng.randint(1, 9))) for j in range(columns))
    return LinearModel("market_split", "maximize", objective, variables, tuple(constraints))


def test_a_solve_is_bounded_by_nodes_and_ends_the_same_way_every_time():
    model = market_split()
    lp = write_lp(model)
    verdicts = {
        (result.status, result.solver_status) for result in (solve.solve_model(model, node_limit=20) for _ in range(2))
    }
    assert verdicts == {("other", "totalnodelimit")}
    highs = {solve.solve_lp_text_highs(lp, node_limit=20).status for _ in range(2)}
    assert highs == {"other"}


def test_no_in_process_solve_of_a_shard_runs_with_a_clock_limit(monkeypatch):
    """Every SCIP solve (the plan's, polish, certificates, IIS tests, what-ifs, both LP-file
    readers) and every HiGHS solve of a shard: no time limit, a node limit."""
    seen_scip: list[tuple[float, int]] = []
    seen_highs = []
    scip_result, quiet_highs = solve._scip_result, solve._quiet_highs

    def recording_scip_result(scip, handles):
        seen_scip.append((scip.getParam("limits/time"), scip.getParam("limits/totalnodes")))
        return scip_result(scip, handles)

    def recording_highs():
        highs = quiet_highs()
        seen_highs.append(highs)
        return highs

    monkeypatch.setattr(solve, "_scip_result", recording_scip_result)
    monkeypatch.setattr(solve, "_quiet_highs", recording_highs)
    solve._LP_MEMO.clear()
    config = SynthConfig(seed=5, families=tuple(FAMILIES), isolation="process")
    context = ShardContext(config)
    try:
        results = synthesize_shard(range(0, 6), context)
    finally:
        context.close()
    assert any(result["result"] == "emitted" for result in results)
    assert seen_scip and seen_highs
    assert {time_limit for time_limit, _ in seen_scip} == {1e20}  # SCIP's "no limit"
    assert all(0 < nodes <= solve.NODE_LIMIT for _, nodes in seen_scip)
    assert {highs.getOptionValue("time_limit")[1] for highs in seen_highs} == {math.inf}
    assert {highs.getOptionValue("mip_max_nodes")[1] for highs in seen_highs} == {solve.NODE_LIMIT}


def test_a_pipeline_program_that_ends_on_a_clock_limit_is_not_recorded():
    loop = "while True:\n    pass\n"
    limits = Limits(wall_s=120, cpu_s=1)  # the loop ends on the CPU limit on any machine
    with ProgramRunner(limits, isolation="process", clock_retries=0) as runner:
        with pytest.raises(ClockLimitReached, match="cpu_limit"):
            runner.run(loop, clock_verdict=False)
        assert runner.run(loop).failure == "cpu_limit"  # a teacher's program: its own failure, recorded
        with pytest.raises(ClockLimitReached):  # and never served from the cache to the pipeline
            runner.run(loop, clock_verdict=False)
        assert runner.runs == 3


class ClockLimited:
    """`Sandbox.run` that reports the wall-clock limit for the programs it is told to (by the count of
    programs run, or every one), as a machine too slow or too loaded for them would."""

    def __init__(self, executions: set[int] | None = None):
        self.executions, self.calls, self.reported = executions, 0, 0
        self.real_run = Sandbox.run

    def install(self, monkeypatch) -> None:
        # a function, not this object: only functions bind as methods when set on the class
        monkeypatch.setattr(
            Sandbox, "run", lambda sandbox, source, *args, **kwargs: self(sandbox, source, *args, **kwargs)
        )

    def __call__(self, sandbox, source, *args, **kwargs):
        self.calls += 1
        if self.executions is None or self.calls in self.executions:
            self.reported += 1
            return Execution(FailureKind.TIMEOUT, "wall-clock limit of 30 s reached", None, 9, "", "", wall_s=30.0)
        return self.real_run(sandbox, source, *args, **kwargs)


CONFIG = SynthConfig(seed=3, shard_size=2, isolation="process")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    synthesize(CONFIG, out, 4, progress=False)
    return out


def test_a_program_slowed_past_its_clock_is_run_again_and_the_output_does_not_change(reference, tmp_path, monkeypatch):
    slow = ClockLimited({3, 4})  # the third program times out, and its first retry too
    slow.install(monkeypatch)
    synthesize(CONFIG, tmp_path, 4, progress=False)
    assert slow.reported == 2
    for name in OUTPUTS:
        assert (tmp_path / name).read_bytes() == (reference / name).read_bytes(), name


def test_a_machine_too_slow_for_every_attempt_stops_the_run_and_it_resumes_to_the_same_output(
    reference, tmp_path, monkeypatch
):
    slow = ClockLimited()  # every program times out, every time
    slow.install(monkeypatch)
    with pytest.raises(
        ClockLimitReached, match=r"ind(ex|ices) [\d-]+: .*clock limit .*3 times.*run the same command again"
    ):
        synthesize(CONFIG, tmp_path, 4, progress=False)
    assert slow.reported == 3  # the first program, then its two retries with 4x and 16x the clocks
    assert not (tmp_path / "sft.jsonl").exists() and not list((tmp_path / "shards").glob("*.jsonl"))
    monkeypatch.undo()
    synthesize(CONFIG, tmp_path, 4, progress=False)
    for name in OUTPUTS:
        assert (tmp_path / name).read_bytes() == (reference / name).read_bytes(), name


def test_a_run_where_every_index_is_rejected_stops_with_the_reasons(tmp_path, monkeypatch):
    """At a yield of 0 the shard scheduler would plan shards forever; the run must stop and say why."""
    from trex.errors import TrexError
    from trex.workloads.or_data import synthesis

    def all_rejected(indices, context):
        return [{"index": i, "result": "rejected", "stage": "verify"} for i in indices]

    monkeypatch.setattr(synthesis, "synthesize_shard", all_rejected)
    with pytest.raises(
        TrexError, match=r"none of the first \d+ indices gave a sample \(rejected or removed: verify \d+\)"
    ):
        synthesize(CONFIG, tmp_path, 4, progress=False)
