"""The sandbox runs ordinary programs faithfully, records solver objectives, and classifies failures."""

from __future__ import annotations

import importlib.util
import os
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workload_helpers import ISOLATIONS

from trex.workloads.sandbox import FailureKind, Limits, Sandbox, SandboxConfigError
from trex.workloads.sandbox.execution import RawOutcome, classify
from trex.workloads.sandbox.policy import PathPolicy

# One small MILP per solver API: max 3x + 2y, x + 2y <= 12, x integer in [0, 10], y in [0, 4.5].
# Optimum: x = 10, y = 1 -> 32.
SOLVER_PROGRAMS = {
    "pyscipopt": """
from pyscipopt import Model
m = Model(); m.hideOutput()
x = m.addVar(vtype='I', ub=10); y = m.addVar(ub=4.5)
m.addCons(x + 2 * y <= 12); m.setObjective(3 * x + 2 * y, 'maximize'); m.optimize()
""",
    "coptpy": """
import coptpy as cp
env = cp.Envr(); m = env.createModel('t'); m.setParam('Logging', 0)
x = m.addVar(vtype=cp.COPT.INTEGER, ub=10); y = m.addVar(ub=4.5)
m.addConstr(x + 2 * y <= 12); m.setObjective(3 * x + 2 * y, cp.COPT.MAXIMIZE); m.solve()
""",
    "gurobipy": """
import gurobipy as gp
m = gp.Model(); m.Params.OutputFlag = 0
x = m.addVar(vtype=gp.GRB.INTEGER, ub=10); y = m.addVar(ub=4.5)
m.addConstr(x + 2 * y <= 12); m.setObjective(3 * x + 2 * y, gp.GRB.MAXIMIZE); m.optimize()
""",
    "pulp": """
import pulp
p = pulp.LpProblem('t', pulp.LpMaximize)
x = pulp.LpVariable('x', 0, 10, cat='Integer'); y = pulp.LpVariable('y', 0, 4.5)
p += 3 * x + 2 * y; p += x + 2 * y <= 12; p.solve(pulp.PULP_CBC_CMD(msg=0))
""",
    "highspy": """
import highspy
h = highspy.Highs(); h.silent()
x = h.addVariable(lb=0, ub=10, type=highspy.HighsVarType.kInteger); y = h.addVariable(lb=0, ub=4.5)
h.addConstr(x + 2 * y <= 12); h.maximize(3 * x + 2 * y)
""",
    "pyomo": """
import pyomo.environ as pyo
m = pyo.ConcreteModel()
m.x = pyo.Var(bounds=(0, 10), domain=pyo.Integers); m.y = pyo.Var(bounds=(0, 4.5))
m.c = pyo.Constraint(expr=m.x + 2 * m.y <= 12)
m.o = pyo.Objective(expr=3 * m.x + 2 * m.y, sense=pyo.maximize)
pyo.SolverFactory('appsi_highs').solve(m)
""",
}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("api", sorted(SOLVER_PROGRAMS))
def test_recorder_reports_the_optimal_objective_of_each_solver_api(sandboxes, api, isolation):
    if not installed(api):
        pytest.skip(f"{api} is not installed")
    execution = sandboxes(isolation).run(SOLVER_PROGRAMS[api])
    assert execution.ok, execution.detail + execution.stderr[-1500:]
    assert execution.last_solve is not None
    assert execution.last_solve.api == api
    assert execution.last_solve.status == "optimal"
    assert execution.last_solve.objective == pytest.approx(32.0)


@pytest.mark.parametrize(
    "program, api",
    [
        (
            "import pyscipopt as ps\nm = ps.Model(); m.hideOutput(); x = m.addVar(lb=0); m.addCons(x <= -1); m.optimize()",
            "pyscipopt",
        ),
        (
            "import coptpy as cp\nm = cp.Envr().createModel(); m.setParam('Logging', 0)\n"
            "x = m.addVar(lb=0); m.addConstr(x <= -1); m.setObjective(x); m.solve()",
            "coptpy",
        ),
    ],
)
def test_recorder_reports_infeasible_models_without_an_objective(sandboxes, program, api):
    if not installed(api):
        pytest.skip(f"{api} is not installed")
    execution = sandboxes("process").run(program)
    assert execution.ok, execution.detail
    assert (execution.last_solve.status, execution.last_solve.objective) == ("infeasible", None)


def test_recorder_keeps_the_last_of_many_solves_without_flooding(sandboxes):
    program = (
        "from pyscipopt import Model\n"
        "for bound in range(1, 151):\n"
        "    m = Model(); m.hideOutput(); x = m.addVar(ub=bound); m.setObjective(x, 'maximize'); m.optimize()\n"
    )
    execution = sandboxes("process").run(program)
    assert execution.ok, execution.detail
    assert execution.last_solve.objective == 150.0
    assert len(execution.solves) == 101  # 100 streamed, then only the last one at exit


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_program_output_and_input_files_round_trip(sandboxes, isolation):
    program = "import sys\nprint(open('data/input.txt').read().upper())\nprint('to stderr', file=sys.stderr)\n"
    execution = sandboxes(isolation).run(program, files={"data/input.txt": "hello"})
    assert execution.ok, execution.detail
    assert execution.stdout == "HELLO\n"
    assert execution.stderr == "to stderr\n"
    assert execution.isolation == isolation


def test_input_file_names_must_stay_in_the_work_directory(sandboxes):
    with pytest.raises(SandboxConfigError, match="relative path"):
        sandboxes("process").run("pass", files={"../escape.txt": "x"})


def test_syntax_error_is_reported_with_its_line(sandboxes):
    execution = sandboxes("process").run("x = 1\ndef broken(:\n")
    assert execution.failure is FailureKind.SYNTAX_ERROR
    assert "line 2" in execution.detail


def test_uncaught_exception_is_a_runtime_error_with_its_message(sandboxes):
    execution = sandboxes("process").run("raise ValueError('model has no objective')")
    assert execution.failure is FailureKind.RUNTIME_ERROR
    assert "ValueError: model has no objective" in execution.detail
    assert "Traceback" in execution.stderr


def test_nonzero_exit_is_a_runtime_error(sandboxes):
    assert sandboxes("process").run("import sys; sys.exit(3)").failure is FailureKind.RUNTIME_ERROR


def test_sleeping_past_the_wall_clock_is_a_timeout(isolation="process"):
    with Sandbox(Limits(wall_s=1, cpu_s=30), isolation=isolation) as sandbox:
        execution = sandbox.run("import time\ntime.sleep(30)")
    assert execution.failure is FailureKind.TIMEOUT
    assert execution.wall_s < 30  # stopped, not slept through (no tighter bound: a loaded machine is slow to reap)


def test_output_beyond_the_file_size_limit_is_an_output_limit(sandboxes):
    execution = sandboxes("process").run("print('x' * (64 << 20))")
    assert execution.failure is FailureKind.OUTPUT_LIMIT


def test_program_cannot_see_the_evaluators_environment(sandboxes, monkeypatch):
    monkeypatch.setenv("TREX_TEST_SECRET", "hunter2")
    execution = sandboxes("process").run("import os\nprint(sorted(os.environ))")
    assert "TREX_TEST_SECRET" not in execution.stdout
    assert "HOME" in execution.stdout


def test_limits_must_be_positive_and_leave_room_for_python():
    with pytest.raises(SandboxConfigError, match="cpu_s"):
        Limits(cpu_s=0)
    with pytest.raises(SandboxConfigError, match="256 MiB"):
        Limits(memory_bytes=64 << 20)


def test_unknown_isolation_level_is_refused():
    with pytest.raises(SandboxConfigError, match="unknown isolation"):
        Sandbox(isolation="vm")


@pytest.mark.skipif(os.geteuid() == 0, reason="as root, os isolation is available")
def test_os_isolation_refused_with_the_reason_when_unavailable():
    with pytest.raises(SandboxConfigError, match="needs root"):
        Sandbox(isolation="os")


def _raw(**overrides) -> RawOutcome:
    values = dict(
        timed_out=False,
        exit_code=0,
        signal=None,
        cpu_s=0.1,
        stderr="",
        events=[],
        setup_error=None,
        limits_cpu_s=10,
        limits_memory_bytes=1 << 30,
    )
    values.update(overrides)
    return RawOutcome(**values)


def test_classification_blames_the_sandbox_for_setup_failures_first():
    kind, detail = classify(_raw(setup_error="mount failed", timed_out=True, signal=9))
    assert kind is FailureKind.SANDBOX_ERROR and "mount failed" in detail


def test_classification_reports_a_violation_even_when_the_program_exits_cleanly():
    events = [{"event": "violation", "kind": "network_denied", "detail": "socket"}]
    assert classify(_raw(events=events))[0] is FailureKind.NETWORK_DENIED


def test_classification_of_signals():
    assert classify(_raw(signal=signal.SIGXCPU, exit_code=None))[0] is FailureKind.CPU_LIMIT
    assert classify(_raw(signal=signal.SIGKILL, exit_code=None, cpu_s=10.0))[0] is FailureKind.CPU_LIMIT
    assert classify(_raw(signal=signal.SIGKILL, exit_code=None, cpu_s=0.5))[0] is FailureKind.KILLED
    assert classify(_raw(signal=signal.SIGABRT, exit_code=None, stderr="std::bad_alloc"))[0] is FailureKind.MEMORY_LIMIT


def test_classification_of_exceptions_by_errno():
    def kind(**event):
        return classify(_raw(exit_code=1, events=[{"event": "exception", **event}]))[0]

    assert kind(type="BlockingIOError", errno=11) is FailureKind.PROCESS_LIMIT
    assert kind(type="OSError", errno=101) is FailureKind.NETWORK_DENIED
    assert kind(type="OSError", errno=30) is FailureKind.FILE_DENIED
    assert kind(type="MemoryError") is FailureKind.MEMORY_LIMIT
    assert kind(type="KeyError") is FailureKind.RUNTIME_ERROR


def test_garbage_on_the_events_channel_is_ignored(sandboxes):
    program = "import os\nfor fd in range(3, 20):\n    try: os.write(fd, b'not json\\n{\"event\": 5}\\n')\n    except OSError: pass\nprint('done')"
    execution = sandboxes("process").run(program)
    assert execution.ok and execution.stdout == "done\n"


# -- the path policy ---------------------------------------------------------------------------

segments = st.lists(st.sampled_from(["a", "b", "venv", "lib", "x.json"]), min_size=1, max_size=5)


def as_path(parts: list[str]) -> str:
    return "/" + "/".join(parts)


@given(allow=segments, deny=segments, query=segments)
def test_policy_longest_matching_rule_decides(allow, deny, query):
    policy = PathPolicy(read_allow=(as_path(allow),), read_deny=(as_path(deny),))
    path = as_path(query)
    matches = [
        (len(rule), verdict)
        for rule, verdict in ((as_path(allow), True), (as_path(deny), False))
        if path == rule or path.startswith(rule + "/")
    ]
    expected = max(matches, key=lambda match: (match[0], not match[1]))[1] if matches else False
    assert policy.may_read(path) is expected


def test_policy_keeps_a_virtualenv_inside_a_hidden_checkout_readable():
    policy = PathPolicy(read_allow=("/repo/.venv",), read_deny=("/repo",), write_roots=("/work",))
    assert policy.may_read("/repo/.venv/lib/site.py")
    assert not policy.may_read("/repo/answers.json")
    assert not policy.may_write("/repo/.venv/lib/site.py")  # readable is not writable
    assert policy.may_write("/dev/null")


def test_policy_round_trips_through_json():
    policy = PathPolicy(read_allow=("/a",), read_deny=("/a/b",), write_roots=("/w",), exec_roots=("/s",))
    assert PathPolicy.from_json(policy.to_json()) == policy
