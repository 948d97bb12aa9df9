"""trex.optim.AdamW: the same update and state as torch's fused AdamW, through every path its cached lists take."""

from __future__ import annotations

import io

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import trex.optim


def _model(dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4, bias=False)
    ).to(dtype)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 1, skip=None) -> None:
    """`steps` steps on seeded data; `skip(step)` names parameters whose gradient is dropped at that step."""
    generator = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for step in range(steps):
        x = torch.randn(5, 8, generator=generator).to(next(model.parameters()).dtype)
        model(x).float().square().mean().backward()
        for name in skip(step) if skip else ():
            params[name].grad = None
        optimizer.step()
        optimizer.zero_grad()


def _assert_same(a: torch.nn.Module, oa: torch.optim.Optimizer, b: torch.nn.Module, ob: torch.optim.Optimizer):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
        sa, sb = oa.state.get(pa, {}), ob.state.get(pb, {})
        assert sa.keys() == sb.keys(), name
        for key in sa:
            assert torch.equal(sa[key], sb[key]), (name, key)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "options",
    [dict(lr=1e-2), dict(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.95)), dict(lr=1e-2, amsgrad=True, maximize=True)],
)
def test_updates_are_bit_equal_to_torch_fused_adamw(dtype, options):
    a, b = _model(dtype), _model(dtype)
    oa, ob = trex.optim.AdamW(a.parameters(), **options), torch.optim.AdamW(b.parameters(), fused=True, **options)
    _train(a, oa, 6)
    _train(b, ob, 6)
    _assert_same(a, oa, b, ob)
    assert oa.state[next(a.parameters())]["step"].item() == 6


def test_updates_match_torch_default_adamw_within_tolerance():
    a, b = _model(), _model()
    oa, ob = trex.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2)
    _train(a, oa, 6)
    _train(b, ob, 6)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_parameters_without_a_gradient_are_skipped_and_keep_their_step_count():
    """Frozen now and then (first step included): only parameters with a gradient move and count, as in torch."""
    skip = lambda step: ["0.bias"] if step in (0, 3) else (["3.weight"] if step == 4 else [])
    a, b = _model(), _model()
    oa, ob = trex.optim.AdamW(a.parameters(), lr=1e-2), torch.optim.AdamW(b.parameters(), lr=1e-2, fused=True)
    _train(a, oa, 6, skip=skip)
    _train(b, ob, 6, skip=skip)
    _assert_same(a, oa, b, ob)
    counts = {name: oa.state[p]["step"].item() for name, p in a.named_parameters()}
    assert counts["0.bias"] == 4 and counts["3.weight"] == 5 and counts["0.weight"] == 6


def test_a_parameter_that_never_gets_a_gradient_has_no_state():
    a = _model()
    a[1].weight.requires_grad_(False)
    oa = trex.optim.AdamW(a.parameters(), lr=1e-2)
    frozen = a[1].weight.clone()
    _train(a, oa, 3)
    assert a[1].weight not in oa.state and torch.equal(a[1].weight, frozen)


def test_state_dict_loads_into_torch_adamw_and_back():
    """trex (3 steps) -> torch (3 steps) -> trex (3 steps), through torch.save bytes: one uninterrupted torch run."""
    reference = _model()
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    _continue(reference, ref_opt, 0, 9)

    def saved(model, optimizer):
        buffer = io.BytesIO()
        torch.save((model.state_dict(), optimizer.state_dict()), buffer)
        buffer.seek(0)
        return torch.load(buffer)

    a = _model()
    oa = trex.optim.AdamW(a.parameters(), lr=1e-2)
    _continue(a, oa, 0, 3)
    t = _model(seed=7)
    ot = torch.optim.AdamW(t.parameters(), lr=1e-2, fused=True)
    weights, state = saved(a, oa)
    t.load_state_dict(weights)
    ot.load_state_dict(state)
    _continue(t, ot, 3, 6)
    c = _model(seed=9)
    oc = trex.optim.AdamW(c.parameters(), lr=1e-2)
    weights, state = saved(t, ot)
    c.load_state_dict(weights)
    oc.load_state_dict(state)
    _continue(c, oc, 6, 9)
    _assert_same(c, oc, reference, ref_opt)
    oa.load_state_dict(oc.state_dict())  # loading into an optimizer that has stepped replaces its counters
    assert oa.state[next(a.parameters())]["step"].item() == 9


def _continue(model: torch.nn.Module, optimizer: torch.optim.Optimizer, start: int, stop: int) -> None:
    """Steps `start`..`stop`-1 of the seeded data stream `_train(..., seed=1)` draws."""
    generator = torch.Generator().manual_seed(1)
    for step in range(stop):
        x = torch.randn(5, 8, generator=generator)
        if step < start:
            continue
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_learning_rate_schedule_and_a_param_group_added_later():
    def run(make):
        model = _model()
        params = list(model.parameters())
        optimizer = make(params[:2])
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        generator = torch.Generator().manual_seed(1)
        for step in range(6):
            if step == 2:
                optimizer.add_param_group({"params": params[2:], "lr": 5e-3, "weight_decay": 0.0})
                schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
            model(torch.randn(5, 8, generator=generator)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            schedule.step()
        return model, optimizer

    a, oa = run(lambda params: trex.optim.AdamW(params, lr=1e-2))
    b, ob = run(lambda params: torch.optim.AdamW(params, lr=1e-2, fused=True))
    _assert_same(a, oa, b, ob)


def test_complex_parameters_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="Use torch.optim.AdamW"):
        trex.optim.AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))])


def test_sparse_gradients_are_refused():
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    optimizer = trex.optim.AdamW(embedding.parameters())
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        optimizer.step()


def test_zero_grad_sets_none_or_zeros():
    a = _model()
    optimizer = trex.optim.AdamW(a.parameters())
    a(torch.randn(2, 8)).sum().backward()
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in a.parameters())
    optimizer.zero_grad()
    assert all(p.grad is None for p in a.parameters())


def test_a_compiled_training_step_matches_eager_with_torch_adamw():
    """trex.compile + trex.optim.AdamW against eager + torch's fused AdamW: loss and parameters after 3 steps."""
    torch._dynamo.reset()
    eager, compiled_base = _model(), _model()
    compiled = trex.compile(compiled_base)
    oe = torch.optim.AdamW(eager.parameters(), lr=1e-2, fused=True)
    oc = trex.optim.AdamW(compiled_base.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(5, 8, generator=generator)
        losses = []
        for module, optimizer in ((eager, oe), (compiled, oc)):
            loss = module(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for pe, pc in zip(eager.parameters(), compiled_base.parameters()):
        torch.testing.assert_close(pc, pe, rtol=1e-5, atol=1e-6)


def test_step_hooks_and_the_profiler_range_run_as_on_torch_optimizers():
    a = _model()
    optimizer = trex.optim.AdamW(a.parameters(), lr=1e-2)
    calls = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: calls.append("global"))
    try:
        _train(a, optimizer, 2)
    finally:
        handle.remove()
    assert calls == ["pre", "post", "global"] * 2
    a(torch.randn(2, 8)).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        optimizer.step()
    assert "Optimizer.step#AdamW.step" in {event.name for event in profile.events()}


@pytest.mark.slow
def test_tiny_qwen3_moe_trains_under_trex_with_trex_adamw_as_eager_with_torch_adamw():
    """The bench's training step (trex.compile + trex.optim.AdamW vs eager + torch's fused AdamW), 3 steps:
    losses and the parameters after the last update within the fp32 numerics tolerance."""
    from trex.models import build_model, tiny_config

    torch._dynamo.reset()
    config = tiny_config("qwen3-moe")
    eager, base = build_model(config, seed=0), build_model(config, seed=0)
    compiled = trex.compile(base)
    oe = torch.optim.AdamW(eager.parameters(), lr=1e-3, fused=True)
    oc = trex.optim.AdamW(base.parameters(), lr=1e-3)
    ids = torch.randint(0, config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        losses = []
        for module, optimizer in ((eager, oe), (compiled, oc)):
            loss = module(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    for (name, pe), pc in zip(eager.named_parameters(), base.parameters()):
        torch.testing.assert_close(pc, pe, rtol=1e-4, atol=1e-5, msg=name)
