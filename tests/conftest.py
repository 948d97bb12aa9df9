"""Shared test setup: hypothesis profiles, one torch thread per xdist worker, tiny models."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():  # trex's Triton kernels are tested by Triton's interpreter, which
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be on before anything imports triton

import trex.ops  # noqa: F401 - SmallMoe calls torch.ops.trex directly

# "ci" (the default) keeps the default run well under CI's budget on 2 cores; "dev" explores more.
settings.register_profile(
    "ci",
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)  # two workers on two cores: no oversubscription


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (Dynamo caches are per process)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _no_trex_environment(monkeypatch):
    for name in ("TREX_DUMP", "TREX_PASSES", "TREX_FUEL"):
        monkeypatch.delenv(name, raising=False)
    # trex's default backends start with Inductor, whose cold C++ compiles take minutes on CI's two
    # cores; tests run eager unless they ask for a backend (tests/backends/ test Inductor itself).
    monkeypatch.setenv("TREX_BACKENDS", "eager")


class SmallMoe(torch.nn.Module):
    """Two MoE layers written directly against the trex op: compiles in about a second."""

    def __init__(self, hidden=16, experts=4, top_k=2, layers=2):
        super().__init__()
        self.top_k = top_k
        self.routers = torch.nn.ModuleList(torch.nn.Linear(hidden, experts, bias=False) for _ in range(layers))
        self.gate_up = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(experts, 2 * hidden, hidden) * hidden**-0.5) for _ in range(layers)
        )
        self.down = torch.nn.ParameterList(
            torch.nn.Parameter(torch.randn(experts, hidden, hidden) * hidden**-0.5) for _ in range(layers)
        )
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x):
        for router, gate_up, down in zip(self.routers, self.gate_up, self.down):
            weights, index = torch.topk(torch.softmax(router(x), -1), self.top_k, dim=-1)
            x = x + torch.ops.trex.moe_experts(x, index, weights, gate_up, down, "silu", 0.0, False)[0]
        return self.head(torch.relu(x)).sum()


@pytest.fixture
def small_moe():
    torch.manual_seed(0)
    return SmallMoe(), torch.randn(8, 16)


@pytest.fixture
def step_matches_eager():
    """A function that runs one forward+backward of a compiled model and of its eager twin on the same tokens and
    asserts equal loss and gradients at the dtype's tolerance (the check every backend and pass test repeats).

    With `fp32_reference=True` a bf16 step is judged against a third run: the same model (its bf16 weights, exact
    in fp32) in fp32. Loss and each gradient of the compiled model must be at most twice as far from that run as
    eager bf16's (2-norm of the difference; at least the distance of the fp32 value rounded to bf16, the error no
    bf16 result avoids). Two bf16 programs that sum in different orders can differ elementwise by more than a
    fixed atol while both are as accurate as bf16 allows; this asks the compiled one to be no less accurate.

    With `hold_routing=True` every program of the comparison (compiled, eager, fp32) takes the routing decisions
    eager makes on the batch (`tests/held_routing.py`: a near-tie decision flips under any change of summation
    order, and one flip moves the loss more than all rounding does); call it before the compiled model's first
    call, which is when the held routers are traced.

    With `batches=N` (fp32 reference only) the step runs on N batches (seeds 0..N-1, seed 0 the one batch of the
    single-step check; each held to
    eager's routing on it when `hold_routing`), and the loss and each gradient are judged on their N values
    together: the 2-norm of the compiled program's distances to the fp32 runs, at most twice eager's. Why: a
    loss is one number, its rounding error one draw of a zero-mean noise, and so is a gradient of a few
    elements (V4's hyper-connection scales have 3): for two programs of equal accuracy the chance that one draw
    of a scalar is more than twice the other's is (2/pi) arctan(1/2) = 30% (tiny V3 bf16 with routing held: trex's
    loss on 8 of 24 batches, plain Inductor's on 9), for 3 elements 14%. Over N draws it is the chance that an
    F(kN, kN) variable (k elements) exceeds 4: 0.4% for a scalar over 16 batches. The bound stays 2x on a
    2-norm; what it judges is a sample of the noise large enough to tell a less accurate program from an
    unlucky draw.

    `tokens=(batch, sequence)` sets the token batch's shape (default (2, 16))."""

    def check(
        compiled, model, reference, config, dtype, fp32_reference=False, hold_routing=False, batches=1, tokens=(2, 16)
    ):
        def batch(seed):
            return torch.randint(0, config.vocab_size, tokens, generator=torch.Generator().manual_seed(seed))

        input_ids = batch(0)
        exact = copy.deepcopy(reference).float() if fp32_reference and dtype == torch.bfloat16 else None
        held = [m for m in (model, reference, exact) if m is not None] if hold_routing else []
        if held:
            import held_routing  # tests/held_routing.py; imports transformers' MoE models, so only when asked

            unheld = copy.deepcopy(reference)

            def choices(ids):
                return held_routing.record_routing(copy.deepcopy(unheld), lambda m: m(input_ids=ids, use_cache=False))

            for m in held:
                held_routing.hold_routing(m, choices(input_ids))
        if exact is not None:
            runs, owners = (compiled, reference, exact), (model, reference, exact)
            losses, grads = [], {}
            for seed in range(batches):  # the compiled program sees inputs of one shape: no recompilation
                ids = batch(seed)
                if seed and held:
                    chosen = choices(ids)
                    for m in held:
                        held_routing.set_held_routing(m, chosen)
                for m in owners:
                    m.zero_grad(set_to_none=True)
                step = []
                for m in runs:
                    loss = m(input_ids=ids, labels=ids, use_cache=False).loss
                    loss.backward()
                    step.append(loss.detach())
                losses.append(step)
                for (name, p), q, r in zip(model.named_parameters(), reference.parameters(), exact.parameters()):
                    if q.grad is not None or p.grad is not None:
                        assert p.grad is not None and q.grad is not None, f"grad of {name}: only one side has one"
                        grads.setdefault(name, []).append([p.grad.clone(), q.grad.clone(), r.grad.clone()])
            over = "" if batches == 1 else f" over {batches} batches"
            _no_less_accurate_than_eager(f"loss{over}", *(torch.stack(column) for column in zip(*losses)))
            for name, values in grads.items():
                _no_less_accurate_than_eager(f"grad of {name}{over}", *(torch.stack(c) for c in zip(*values)))
            return
        loss = compiled(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        expected = reference(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        expected.backward()
        rtol, atol = {torch.float32: (1e-4, 1e-5), torch.bfloat16: (5e-2, 2e-2)}[dtype]
        torch.testing.assert_close(loss, expected, rtol=rtol, atol=atol)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if q.grad is not None or p.grad is not None:
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m, n=name: f"grad of {n}: {m}"
                )

    return check


def _no_less_accurate_than_eager(what, actual, eager, exact):
    """`actual`'s distance to the fp32 `exact` value is at most twice eager's (or twice the bf16 rounding of it)."""
    exact = exact.detach().float()
    error = torch.linalg.vector_norm(actual.detach().float() - exact).item()
    eager_error = torch.linalg.vector_norm(eager.detach().float() - exact).item()
    rounding = torch.linalg.vector_norm(exact.to(eager.dtype).float() - exact).item()
    allowed = 2 * max(eager_error, rounding)
    assert error <= allowed, (
        f"{what}: distance to the fp32 run {error:.3g} > {allowed:.3g} (2 x max(eager bf16's {eager_error:.3g}, "
        f"bf16 rounding {rounding:.3g}))"
    )
