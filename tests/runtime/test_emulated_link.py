"""Emulated links: a collective's wall time follows the link model, its wait costs no CPU, results are gloo's;
and, on the same two ranks, reorder_comm's cross-rank check of the collective order and ZeRO-3 inside the graph
compiled with and without reorder_comm (losses equal to one process training the whole batch).

Two gloo ranks under `trex_link` with a slow link (alpha 2 ms, 0.01 GB/s): every functional collective
(the nodes of captured graphs), the plain `dist.*` calls and an all-to-all with uneven splits give
gloo's exact results; each takes at least the cost model's time for its bytes on that link (and not
much more), while the process's CPU time over the waits stays a small fraction of the wall time.
"""

from __future__ import annotations

import time

import pytest
import torch

from trex.errors import TrexError
from trex.runtime.emulated_link import ZERO_LINK, parse_link
from trex.runtime.launcher import launch_function

LINK = "alpha_us=2000,gbps=0.01"
SENDS = [[1000, 31768], [1001, 31767]]  # rows rank r sends to each rank (uneven all-to-all)


def test_parse_link_reads_numbers_tiers_and_refuses_bad_text():
    link = parse_link("alpha_us=20,gbps=5")
    assert link.alpha_s == pytest.approx(20e-6) and link.bandwidth_bps == pytest.approx(5e9)
    assert parse_link(link.spec) == parse_link(link.spec)  # the spec the ranks receive reads back
    assert parse_link(link.spec).alpha_s == pytest.approx(link.alpha_s)
    ndr = parse_link("infiniband-ndr")
    assert ndr.alpha_s == pytest.approx(6e-6) and ndr.bandwidth_bps == pytest.approx(50e9 * 0.82)
    assert parse_link("zero") is ZERO_LINK and ZERO_LINK.collective_seconds("all_reduce", 1e9, 2) == 0.0
    for bad, match in (("alpha_us=x", "not a number"), ("speed=3", "unknown key"), ("nvlink9", "not a tier")):
        with pytest.raises(TrexError, match=match):
            parse_link(bad)
    # the model is the cost model's alpha-beta: ring all-reduce over 2 ranks = 2 alpha + n / B
    assert link.collective_seconds("all_reduce", 1e6, 2) == pytest.approx(2 * 20e-6 + 1e6 / 5e9)


def timed_collectives(link: str) -> dict:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    from trex.runtime import emulated_link

    dist.init_process_group(emulated_link.install(link))
    model = emulated_link.current_link()
    rank, group = dist.get_rank(), dist.group.WORLD
    x = torch.arange(32768, dtype=torch.float32) + rank  # 128 KiB
    nbytes = x.numel() * 4
    checks = {
        "all_reduce": (lambda: fc.wait_tensor(fc.all_reduce(x, "sum", group)), nbytes),
        "all_gather": (lambda: fc.wait_tensor(fc.all_gather_single(x, 0, group)), 2 * nbytes),
        "reduce_scatter": (lambda: fc.wait_tensor(fc.reduce_scatter_single(x, "sum", 0, group)), nbytes),
        "all_to_all": (
            lambda: fc.wait_tensor(fc.all_to_all_single(x, [SENDS[src][rank] for src in range(2)], SENDS[rank], group)),
            nbytes,
        ),
        # the _out variants (Inductor's bucketing emits them) are charged too, not sent around the link
        "all_gather_out": (
            lambda: fc.wait_tensor(
                torch.ops._c10d_functional.all_gather_into_tensor_out(
                    x, 2, group.group_name, out=torch.empty(2 * x.numel())
                )
            ),
            2 * nbytes,
        ),
        "reduce_scatter_out": (
            lambda: fc.wait_tensor(
                torch.ops._c10d_functional.reduce_scatter_tensor_out(
                    x, "sum", 2, group.group_name, out=torch.empty(x.numel() // 2)
                )
            ),
            nbytes,
        ),
    }
    out = {"rank": rank, "timings": {}, "values": {}}
    emulated_link.STATS.recording = True
    dist.barrier()
    for kind, (call, moved) in checks.items():
        call()  # warm up (first-call setup of the functional collectives)
        dist.barrier()
        emulated_link.STATS.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        value = call()
        out.setdefault("traces", {})[kind] = list(emulated_link.STATS.trace)
        out.setdefault("events", {})[kind] = [list(row) for row in emulated_link.STATS.events]
        out["timings"][kind] = (
            time.perf_counter() - wall,
            time.process_time() - cpu,
            model.collective_seconds(kind.removesuffix("_out"), moved, 2),
        )
        out["values"][kind] = value.clone()
    plain = torch.empty(2 * x.numel())
    dist.all_gather_into_tensor(plain, x)
    out["values"]["dist.all_gather_into_tensor"] = plain
    # a collective nobody wait()s on, only its future: the link's clock thread completes it at its deadline
    emulated_link.STATS.reset()
    summed = x.clone()
    dist.all_reduce(summed, async_op=True).get_future().wait()
    out["values"]["future only"] = summed
    out["future only"] = [list(row) for row in emulated_link.STATS.events]
    # buckets (reorder_comm's coalesced collectives) travel packed in one gloo call and come back unpacked
    members = [x[:96].reshape(48, 2), x[96:100], x[100:164].reshape(2, 32)]
    gathered = torch.ops._c10d_functional.all_gather_into_tensor_coalesced(members, 2, group.group_name)
    out["values"]["bucketed all_gather"] = [fc.wait_tensor(t).clone() for t in gathered]
    reduced = torch.ops._c10d_functional.reduce_scatter_tensor_coalesced(members, "sum", 2, group.group_name)
    out["values"]["bucketed reduce_scatter"] = [fc.wait_tensor(t).clone() for t in reduced]
    # reorder_comm's deadlock check across ranks: the same collective order passes, a different one is named
    from trex.passes.reorder_comm import CollectiveOrderError, check_across_ranks

    out["same_order"] = check_across_ranks(["all_reduce@0[float32]", "all_gather@0[float32]"], 0)
    try:
        sequence = ["all_reduce@0[float32]", "all_gather@0[float32]"]
        check_across_ranks(sequence if rank == 0 else sequence[::-1], 1)
        out["other_order"] = "accepted"
    except CollectiveOrderError as error:
        out["other_order"] = str(error)
    dist.barrier()
    out["zero3"] = zero3_in_graph_losses()
    dist.destroy_process_group()
    return out


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def small_net_losses(model, rows, steps=2, forward=None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    data = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    losses = []
    for _ in range(steps):
        loss = ((forward or model)(data[rows]) ** 2).sum() / data.size(0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def zero3_in_graph_losses() -> dict:
    """ZeRO-3 inside the graph, compiled by trex with and without reorder_comm: per-rank losses of 2 AdamW steps
    and the pass's decisions."""
    import torch.distributed as dist

    import trex
    from trex.runtime.data_parallel import shard_parameters_in_graph

    rank = dist.get_rank()
    out = {}
    for label, passes in (("pass", None), ("no_pass", "-reorder_comm")):
        torch._dynamo.reset()
        model = SmallNet()
        shard_parameters_in_graph(model, dist.group.WORLD)
        compiled = trex.compile(model, backend="eager", passes=passes)
        losses = small_net_losses(model, slice(4 * rank, 4 * rank + 4), forward=compiled)
        totals = []
        for loss in losses:
            dist.all_reduce(loss)
            totals.append(float(loss))
        records = [r for g in compiled.trex.graphs for r in g.report.records if r.name == "reorder_comm" and r.ran]
        out[label] = {"losses": totals, "decisions": [d.action for r in records for d in r.decisions]}
    return out


def test_collectives_over_an_emulated_link_take_the_model_time_without_cpu():
    results = launch_function(timed_collectives, (LINK,), 2)
    x = [torch.arange(32768, dtype=torch.float32) + r for r in range(2)]
    assert "published digest" in results[0]["same_order"] and "same collective order" in results[1]["same_order"]
    assert "rank 1 would issue its 2 collectives of graph 1 in another order than rank 0" in results[1]["other_order"]
    # ZeRO-3 in the graph over the emulated link: trex.compile with and without reorder_comm gives the losses
    # of one process training the whole batch
    want = [float(x) for x in small_net_losses(SmallNet(), slice(0, 8))]
    for result in results.values():
        zero3 = result["zero3"]
        assert zero3["pass"]["losses"] == zero3["no_pass"]["losses"], zero3
        assert zero3["pass"]["losses"] == pytest.approx(want, rel=1e-5)
        assert "summary" in zero3["pass"]["decisions"] and "schedule" in zero3["pass"]["decisions"]
        assert not zero3["no_pass"]["decisions"]
    for rank, result in results.items():
        values = result["values"]
        torch.testing.assert_close(values["all_reduce"], x[0] + x[1])
        torch.testing.assert_close(values["all_gather"], torch.cat(x))
        torch.testing.assert_close(values["dist.all_gather_into_tensor"], torch.cat(x))
        torch.testing.assert_close(values["future only"], x[0] + x[1])
        [(_, _, _, deadline, completed, called, _)] = result["future only"]
        assert completed >= deadline and called != called  # completed by the clock, at or after its deadline (NaN)
        torch.testing.assert_close(values["reduce_scatter"], (x[0] + x[1]).chunk(2)[rank])
        torch.testing.assert_close(values["all_gather_out"], torch.cat(x))
        torch.testing.assert_close(values["reduce_scatter_out"], (x[0] + x[1]).chunk(2)[rank])
        want = torch.cat([x[src].split(SENDS[src])[rank] for src in range(2)])
        torch.testing.assert_close(values["all_to_all"], want)
        # the trace says what each collective moved: an uneven all-to-all sends its input, receives its splits
        assert result["traces"]["all_to_all"] == [("all_to_all", 32768 * 4, sum(s[rank] for s in SENDS) * 4)]
        assert result["traces"]["all_reduce"] == [("all_reduce", 32768 * 4, 32768 * 4)]
        members = [[t[:96].reshape(48, 2), t[96:100], t[100:164].reshape(2, 32)] for t in x]
        for got, one, two in zip(values["bucketed all_gather"], *members):
            torch.testing.assert_close(got, torch.cat([one, two]))
        for got, one, two in zip(values["bucketed reduce_scatter"], *members):
            torch.testing.assert_close(got, (one + two).chunk(2)[rank])
        for kind, (wall, cpu, model) in result["timings"].items():
            assert model > 4e-3, (kind, model)  # the link model charges milliseconds here
            # the collective's own clock: the link holds it exactly the model's time after gloo delivered it, and
            # neither its completion nor the rank's wait() comes before that deadline (on any machine: the order of
            # these instants does not depend on speed)
            [(issued, arrived, began, deadline, completed, called, returned)] = result["events"][kind]
            assert issued <= arrived <= began and deadline - began == pytest.approx(model, rel=1e-9), kind
            assert completed >= deadline and returned >= deadline and returned >= called >= issued, kind
            assert wall >= model, (rank, kind, wall, model)  # never faster than the link
            assert wall < model + 10.0, (rank, kind, wall, model)  # the wait ends (not a speed test: any machine)
            assert cpu < 0.5 * wall + 0.02, (rank, kind, cpu, wall)  # waiting does not burn CPU
