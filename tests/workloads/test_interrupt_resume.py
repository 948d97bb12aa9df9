"""Ctrl-C, then the same command again, gives the clean run's results byte for byte.

An interrupted program is never a result (`trex.workloads.sandbox.interruption`): the sandboxed
programs do not get the terminal's signals, the evaluator stops them and records nothing for them,
and the resumed run executes them again. The commands run as a user runs them: a `trex` process
whose process group gets SIGINT, as a terminal's Ctrl-C delivers it, at several points of the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from workload_helpers import FAST_LIMITS

from trex.workloads.sandbox import RunInterrupted, Sandbox

# Each program solves a small LP with SCIP, then works a little, so interrupts land on programs in
# flight; the objective depends on the item, so a mixed-up result would show.
PROGRAM = """\
import time
from pyscipopt import Model
m = Model()
m.hideOutput()
x = m.addVar(lb=0, ub={bound})
y = m.addVar(lb=0, ub=3)
m.addCons(x + y <= {bound} + 1)
m.setObjective(2 * x + y, "maximize")
m.optimize()
time.sleep(0.3)
print("objective:", m.getObjVal())
"""
ITEMS = 10
# fields whose values are measurements, not outcomes
_MEASURED = ("wall_s", "cpu_s")


def _trex(*arguments: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from trex.cli import main; sys.exit(main())", *arguments]


@pytest.fixture(scope="module")
def predictions(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("interrupt-data") / "predictions.jsonl"
    with open(path, "w", encoding="utf-8") as file:
        for number in range(ITEMS):
            bound = number + 1
            answer = 2 * bound + 1
            record = {"question": f"item {number}", "answer": answer, "program": PROGRAM.format(bound=bound)}
            file.write(json.dumps(record) + "\n")
    return path


def _eval_command(predictions: Path, out: Path) -> list[str]:
    return _trex(
        "eval",
        "--client",
        "replay",
        "--predictions",
        str(predictions),
        "--form",
        "pyscipopt",
        "--out",
        str(out),
        "--workers",
        "2",
        "--isolation",
        "process",
        "--json",
        "--no-progress",
    )


def _records(out: Path) -> bytes:
    """The results, keyed and sorted, without measured times: what must not depend on interrupts."""
    records = {}
    for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for name in _MEASURED:
            record.pop(name)
        records[record["key"]] = record
    return json.dumps(records, sort_keys=True).encode()


def _report_scores(out: Path) -> bytes:
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return json.dumps({key: report[key] for key in ("scores", "failures") if key in report}, sort_keys=True).encode()


def _lines(path: Path) -> int:
    try:
        return len(path.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


def _interrupt_when(command: list[str], ready, *, deadline_s: float = 120) -> int:
    """Start `command` in its own process group, send that group SIGINT (a terminal's Ctrl-C) once
    `ready()` holds, and return the exit status."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    give_up = time.monotonic() + deadline_s
    while not ready() and process.poll() is None and time.monotonic() < give_up:
        time.sleep(0.01)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=deadline_s)
    assert process.returncode in (130, -signal.SIGINT, 0), stderr.decode()[-2000:]
    return process.returncode


@pytest.fixture(scope="module")
def clean_eval(predictions, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval-clean")
    subprocess.run(_eval_command(predictions, out), check=True, stdout=subprocess.DEVNULL, timeout=300)
    return out


def _interrupt_and_resume_eval(predictions: Path, out: Path, after_results: int) -> None:
    _interrupt_when(_eval_command(predictions, out), lambda: _lines(out / "results.jsonl") >= after_results)
    subprocess.run(_eval_command(predictions, out), check=True, stdout=subprocess.DEVNULL, timeout=300)


def test_eval_interrupted_while_programs_run_then_resumed_matches_the_clean_run(predictions, clean_eval, tmp_path):
    _interrupt_and_resume_eval(predictions, tmp_path, after_results=3)
    assert _records(tmp_path) == _records(clean_eval)
    assert _report_scores(tmp_path) == _report_scores(clean_eval)


def _recorded_keys(out: Path) -> set[str]:
    keys = set()
    for line in (out / "results.jsonl").read_text(encoding="utf-8").splitlines():
        try:
            keys.add(json.loads(line)["key"])
        except (ValueError, KeyError, TypeError):
            continue  # a line the kill cut short is not a record
    return keys


def test_eval_sigkilled_mid_run_then_resumed_executes_only_what_was_not_recorded(predictions, clean_eval, tmp_path):
    command = _eval_command(predictions, tmp_path)
    command[command.index("process")] = "auto"  # warm workers in bubblewrap where it runs
    evaluator = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _lines(tmp_path / "results.jsonl") < 3 and evaluator.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    evaluator.kill()  # SIGKILL: no handler runs, nothing is cleaned up by the evaluator itself
    evaluator.wait()
    recorded = _recorded_keys(tmp_path)
    assert 3 <= len(recorded) < ITEMS
    resumed = subprocess.run(command, check=True, capture_output=True, timeout=300)
    report = json.loads(resumed.stdout)
    assert report["programs_executed"] == ITEMS - len(recorded)  # only the unrecorded items ran again
    assert _records(tmp_path) == _records(clean_eval)
    assert _report_scores(tmp_path) == _report_scores(clean_eval)


@pytest.mark.slow
@pytest.mark.parametrize("after_results", [0, 1, 6, 9])
def test_eval_interrupted_at_other_points_matches_the_clean_run(predictions, clean_eval, tmp_path, after_results):
    _interrupt_and_resume_eval(predictions, tmp_path, after_results)
    assert _records(tmp_path) == _records(clean_eval)
    assert _report_scores(tmp_path) == _report_scores(clean_eval)


def _synth_command(out: Path, workers: int) -> list[str]:
    return _trex(
        "data",
        "synth",
        "--n",
        "12",
        "--out",
        str(out),
        "--seed",
        "3",
        "--shard-size",
        "3",
        "--workers",
        str(workers),
        "--no-progress",
        "--no-decontaminate",
        "--isolation",
        "process",
        "--json",
    )


def _synth_outputs(out: Path) -> dict[str, bytes]:
    shards = {f"shards/{p.name}": p.read_bytes() for p in sorted((out / "shards").glob("shard-*.jsonl"))}
    # `seconds` is a measurement; everything else in a shard is a function of (seed, index)
    for name, data in shards.items():
        lines = [json.loads(line) for line in data.decode().splitlines()]
        for line in lines:
            line.pop("seconds")
        shards[name] = json.dumps(lines, sort_keys=True).encode()
    return {"sft.jsonl": (out / "sft.jsonl").read_bytes(), "cpt.jsonl": (out / "cpt.jsonl").read_bytes(), **shards}


@pytest.fixture(scope="module")
def clean_synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth-clean")
    subprocess.run(_synth_command(out, 1), check=True, stdout=subprocess.DEVNULL, timeout=600)
    return out


def _shards_done(out: Path) -> int:
    return len(list((out / "shards").glob("shard-*.jsonl"))) if (out / "shards").is_dir() else 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_synth_interrupted_then_resumed_writes_the_clean_runs_output(clean_synth, tmp_path, workers):
    _interrupt_when(_synth_command(tmp_path, workers), lambda: _shards_done(tmp_path) >= 1)
    subprocess.run(_synth_command(tmp_path, workers), check=True, stdout=subprocess.DEVNULL, timeout=600)
    produced, expected = _synth_outputs(tmp_path), _synth_outputs(clean_synth)
    assert produced.keys() >= {"sft.jsonl", "cpt.jsonl"}
    for name in expected:
        if name in produced:  # a resumed run may stop before making shards the clean run made (or after)
            assert produced[name] == expected[name], name


@pytest.mark.slow
@pytest.mark.parametrize("shards_first", [0, 2])
def test_synth_interrupted_at_other_points_writes_the_clean_runs_output(clean_synth, tmp_path, shards_first):
    _interrupt_when(_synth_command(tmp_path, 2), lambda: _shards_done(tmp_path) >= shards_first)
    subprocess.run(_synth_command(tmp_path, 2), check=True, stdout=subprocess.DEVNULL, timeout=600)
    produced, expected = _synth_outputs(tmp_path), _synth_outputs(clean_synth)
    for name in expected:
        if name in produced:
            assert produced[name] == expected[name], name


def test_programs_run_outside_the_evaluators_session_and_miss_its_ctrl_c():
    with Sandbox(FAST_LIMITS, isolation="process") as sandbox:
        execution = sandbox.run("import os\nprint(os.getsid(0), os.getpgid(0))\n")
    assert execution.ok, execution.detail
    session, group = map(int, execution.stdout.split())
    assert session != os.getsid(0) and group != os.getpgid(0)


@pytest.mark.parametrize("warm", [True, False])
def test_an_aborted_run_raises_instead_of_returning_a_result(warm):
    with Sandbox(FAST_LIMITS, isolation="process", warm=warm) as sandbox:
        sandbox.wait_ready()  # the abort under test is of a running program, not of a worker still starting
        outcome: list = []

        def run() -> None:
            try:
                outcome.append(sandbox.run("import time\nprint('started', flush=True)\ntime.sleep(30)\n"))
            except RunInterrupted as error:
                outcome.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 30

        def running() -> bool:
            return bool(sandbox._in_flight or (sandbox._pool is not None and sandbox._pool._busy))

        while not running() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        started = time.monotonic()
        sandbox.abort()
        thread.join(30)
        assert isinstance(outcome[0], RunInterrupted), outcome
        assert time.monotonic() - started < 30  # the abort ended it before its own 30 s sleep could
        with pytest.raises(RunInterrupted):
            sandbox.run("print(1)")
