"""Expert parallelism: the expert-parallel MoE layer as graph nodes, and the sharding of experts modules.

With ep > 1 each rank of an expert-parallel group holds E/ep consecutive experts. The layer routes
this rank's (token, slot) rows to the ranks that own their experts and brings the results back, each
step its own custom op, so a captured graph shows (and a pass can move) every exchange:

  dispatch  sort rows by global expert (`trex.moe_dispatch`); exchange per-expert row counts
            (`trex.ep_counts`, an all-to-all with equal splits), then the rows themselves
            (`trex.ep_exchange` + `_c10d_functional.wait_tensor`, uneven splits from those counts)
  experts   `trex.ep_experts_local`: regroup the received rows by local expert; two grouped GEMMs with
            the gated activation
  combine   the reverse `trex.ep_exchange` + wait, then `trex.moe_combine` (routing weights, sum over k)

The ops are `torch.library.custom_op`s with fake implementations (the received-row count is data
dependent: an unbacked size bound by `trex.ep_rows`) and autograd registrations (an exchange's gradient
is the reverse exchange; the local experts' is two nodes, `ep_experts_local_input_backward` (data gradients)
and `ep_experts_local_weight_backward`; the three local ops live in `trex.ops.ep_experts`, this module
builds the layer around them). The
local math is the one `trex.moe_experts` runs (same primitives), which is why the losses equal the
1-rank run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trex.errors import TrexError
from trex.ops.moe import _expert_weights

IMPLEMENTATION_NAME = "trex_ep"
ops = torch.ops.trex


def _group(group_name: str) -> dist.ProcessGroup:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


# ---------------------------------------------------------------------------------------------
# The layer as separate graph nodes: dispatch exchange / local experts / combine exchange.
#
# The captured graph holds one node per exchange (`trex.ep_exchange`, which starts the all-to-all as a
# functional collective) followed by `_c10d_functional.wait_tensor`, and one node for the local experts;
# a scheduling pass (passes/reorder_comm) can then issue an exchange early and wait for it late. The local
# arithmetic is `trex.moe_experts`' (same primitives), so losses and gradients equal the 1-rank run.


def _splits(counts: Tensor) -> list[int]:
    return [int(c) for c in counts.tolist()]


@torch.library.custom_op("trex::ep_counts", mutates_args=())
def ep_counts(counts: Tensor, group_name: str) -> Tensor:
    """Per-expert row counts this rank sends [E] -> the counts every rank sends to this rank's experts [ep, E_local].

    Blocking (the row exchanges are sized by it) and small: its cost is the link's latency."""
    group = _group(group_name)
    ep = dist.get_world_size(group)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    return received.view(ep, counts.numel() // ep)


@ep_counts.register_fake
def _(counts, group_name):
    ep = dist.get_world_size(_group(group_name))
    return counts.new_empty(ep, counts.numel() // ep)


@torch.library.custom_op("trex::ep_rows", mutates_args=())
def ep_rows(counts: Tensor) -> int:
    """The number of rows an exchange receives (the sum of its receive counts): the graph's data-dependent size.

    Its own node binds that size, so the exchange after it has a known output size and the partitioner never
    re-runs a collective just to learn a size."""
    return int(counts.sum())


@ep_rows.register_fake
def _(counts):
    return torch.library.get_ctx().new_dynamic_size()


@torch.library.custom_op("trex::ep_exchange", mutates_args=())
def ep_exchange(rows: Tensor, send_counts: Tensor, recv_counts: Tensor, out_rows: int, group_name: str) -> Tensor:
    """Start the all-to-all of `rows` (send_counts[r] rows to rank r; recv_counts[r] arrive from rank r).

    Returns the receive buffer of a functional collective: `_c10d_functional.wait_tensor` on it completes
    the exchange (the graph holds that wait as its own node). `out_rows` is the receive size when the
    graph knows it statically (the combine), else -1 (data dependent)."""
    recv_splits, send_splits = _splits(recv_counts), _splits(send_counts)
    return torch.ops._c10d_functional.all_to_all_single(rows.contiguous(), recv_splits, send_splits, group_name)


@ep_exchange.register_fake
def _(rows, send_counts, recv_counts, out_rows, group_name):
    if isinstance(out_rows, int) and out_rows < 0:
        out_rows = torch.library.get_ctx().new_dynamic_size()
    return rows.new_empty(out_rows, *rows.shape[1:])


def _exchange_setup(ctx, inputs, output):
    rows, send_counts, recv_counts, _, group_name = inputs
    ctx.save_for_backward(send_counts, recv_counts)
    ctx.rows, ctx.group_name = rows.size(0), group_name


def _exchange_backward(ctx, grad):
    send_counts, recv_counts = ctx.saved_tensors
    return exchange(grad, recv_counts, send_counts, ctx.rows, ctx.group_name), None, None, None, None


ep_exchange.register_autograd(_exchange_backward, setup_context=_exchange_setup)


def exchange(rows: Tensor, send_counts: Tensor, recv_counts: Tensor, out_rows, group_name: str) -> Tensor:
    """`ep_exchange` and its wait (two graph nodes); differentiable: the gradient takes the reverse exchange.

    `wait_tensor` has no autograd formula of its own; autograd passes the gradient through it unchanged,
    which is its meaning (it returns its input once the collective has landed)."""
    started = ops.ep_exchange(rows.contiguous(), send_counts, recv_counts, out_rows, group_name)
    return torch.ops._c10d_functional.wait_tensor(started)


def routed_experts_ep(
    hidden: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    activation: str,
    swiglu_limit: float,
    weights_transposed: bool,
    group_name: str,
    ep: int,
    chunks: int = 1,
) -> Tensor:
    """The routed experts' output over the expert-parallel group `group_name`: dispatch exchange -> local
    experts -> combine exchange, each its own graph node (`ep`: the group's size, known when the experts were
    sharded; Dynamo cannot look a group up).

    With `chunks` > 1 the tokens are cut into that many micro-chunks, traced in pipeline order: one (blocking)
    count exchange for all chunks, then every chunk's dispatch started, then per chunk its experts and its combine
    started, then the combines' waits. Chunk i+1's dispatch then travels while chunk i's experts compute, and
    chunk i's combine while chunk i+1's do (`cost_model.ep_chunks`). Each row's arithmetic is the one-chunk
    layer's; only the grouping of rows in the grouped GEMMs (and the order of the weight gradients' sums)
    differs."""
    w_gate_up, _ = _expert_weights(gate_up_proj, down_proj, weights_transposed)
    local_experts = w_gate_up.size(0)
    chunks = max(1, min(int(chunks), hidden.size(0)))
    parts = list(zip(hidden.chunk(chunks), top_k_index.chunk(chunks), top_k_weights.chunk(chunks)))
    sorted_rows = []
    for part_hidden, part_index, _ in parts:
        sorted_hidden, perm, offsets = ops.moe_dispatch(part_hidden.to(w_gate_up.dtype), part_index, local_experts * ep)
        counts = torch.diff(offsets.to(torch.int64), prepend=offsets.new_zeros(1, dtype=torch.int64))
        sorted_rows.append((sorted_hidden, perm, counts))
    # one blocking count exchange for all chunks (each one is a rendezvous of the ranks): every rank's slice holds
    # its experts' counts of chunk 0, 1, ...; what arrives is [ep, chunks * local] -> chunk i's [ep, local]
    stacked = torch.stack([counts for _, _, counts in sorted_rows]).view(chunks, ep, local_experts)
    received = ops.ep_counts(stacked.transpose(0, 1).reshape(-1), group_name).view(ep, chunks, local_experts)
    routed = [
        (sorted_hidden, perm, counts, received[:, i].contiguous())
        for i, (sorted_hidden, perm, counts) in enumerate(sorted_rows)
    ]
    dispatched = []
    for sorted_hidden, _, counts, recv_counts in routed:
        send_rows, recv_rows = counts.view(ep, local_experts).sum(1), recv_counts.sum(1)
        started = ops.ep_exchange(sorted_hidden.contiguous(), send_rows, recv_rows, ops.ep_rows(recv_rows), group_name)
        dispatched.append((started, send_rows, recv_rows))
    combines = []
    for (started, send_rows, recv_rows), (sorted_hidden, _, _, recv_counts), (_, part_index, _) in zip(
        dispatched, routed, parts
    ):
        received = torch.ops._c10d_functional.wait_tensor(started)
        local_out, *_saved = ops.ep_experts_local(
            received,
            recv_counts,
            gate_up_proj,
            down_proj,
            activation,
            swiglu_limit,
            weights_transposed,
            part_index.numel(),
        )
        combines.append(
            ops.ep_exchange(local_out.contiguous(), recv_rows, send_rows, sorted_hidden.size(0), group_name)
        )
    outputs = [
        ops.moe_combine(torch.ops._c10d_functional.wait_tensor(started), perm, part_weights).to(hidden.dtype)
        for started, (_, perm, _, _), (_, _, part_weights) in zip(combines, routed, parts)
    ]
    return outputs[0] if chunks == 1 else torch.cat(outputs)


def price_ep_layer(module: nn.Module, tokens: int, top_k: int, cluster) -> dict[str, float]:
    """The cost model's times (seconds) for one EP layer of `module` on `tokens` tokens of this rank, one chunk:
    the dispatch and combine exchanges, the local experts (forward and backward), the blocking count exchange,
    the link's latency (`experts_weight_backward`: the weight-gradient part of the backward), and what each extra chunk adds (`extra_chunk`: the backward's sum of that chunk's
    expert-weight gradients into the others'). Priced by `annotate_node` on graph nodes of the same ops and shapes the captured layer will hold
    (meta tensors), so the figures are the ones reorder_comm reads from `node.meta["cost"]`."""
    from torch import fx

    from trex.cost_model.annotate import annotate_node

    gate_up, down = module.gate_up_proj, module.down_proj
    dtype = gate_up.dtype
    width = _expert_weights(gate_up, down, module.trex_ep_layout.weights_transposed)[0].size(1)
    rows = tokens * top_k
    graph = fx.Graph()

    def value(name: str, tensor: Tensor) -> fx.Node:
        node = graph.placeholder(name)
        node.meta["val"] = tensor
        return node

    meta = torch.device("meta")
    sent = value("rows", torch.empty(rows, width, dtype=dtype, device=meta))
    counts = value("counts", torch.empty(module.trex_ep_size, dtype=torch.int64, device=meta))
    experts_counts = value(
        "expert_counts", torch.empty(gate_up.size(0) * module.trex_ep_size, dtype=torch.int64, device=meta)
    )
    weights = [value(n, torch.empty(p.shape, dtype=p.dtype, device=meta)) for n, p in (("w1", gate_up), ("w2", down))]
    group = module.trex_ep_group
    layout = module.trex_ep_layout
    nodes = {
        "dispatch": graph.call_function(ops.ep_exchange.default, (sent, counts, counts, rows, group)),
        "experts": graph.call_function(
            ops.ep_experts_local.default,
            (sent, counts, *weights, layout.activation, layout.swiglu_limit, layout.weights_transposed, rows),
        ),
        "counts": graph.call_function(ops.ep_counts.default, (experts_counts, group)),
    }
    # the backward of the local experts: the two nodes the captured backward holds (data gradients, then weight
    # gradients; see `ep_experts_local_input_backward`; the saved tensors only shape the bytes). Their sum is the
    # experts' backward; the second part can hide an exchange
    activation = (layout.activation, layout.swiglu_limit, layout.weights_transposed, rows)
    nodes["experts_input_backward"] = graph.call_function(
        ops.ep_experts_local_input_backward.default, (sent, counts, *weights, counts, sent, *activation)
    )
    nodes["experts_input_backward"].meta["val"] = [torch.empty(rows, width, dtype=dtype, device=meta)]
    nodes["experts_weight_backward"] = graph.call_function(
        ops.ep_experts_local_weight_backward.default, (sent, counts, *weights, sent, sent, sent, *activation)
    )
    nodes["experts_weight_backward"].meta["val"] = [torch.empty(1, dtype=dtype, device=meta)]
    # a chunked layer's backward sums each chunk's expert-weight gradients: one add per weight and extra chunk
    for name, weight in zip(("weight_sum_gate_up", "weight_sum_down"), weights):
        nodes[name] = graph.call_function(torch.ops.aten.add.Tensor, (weight, weight))
        nodes[name].meta["val"] = torch.empty(weight.meta["val"].shape, dtype=dtype, device=meta)
    nodes["dispatch"].meta["val"] = torch.empty(rows, width, dtype=dtype, device=meta)
    nodes["counts"].meta["val"] = torch.empty(module.trex_ep_size, gate_up.size(0), dtype=torch.int64, device=meta)
    nodes["experts"].meta["val"] = [torch.empty(rows, width, dtype=dtype, device=meta)]
    out = {}
    for name, node in nodes.items():
        cost = annotate_node(node, cluster)
        out[name] = float(cost.time_s) if cost is not None and cost.priced else 0.0
    out["extra_chunk"] = out.pop("weight_sum_gate_up") + out.pop("weight_sum_down")
    out["experts_backward"] = out.pop("experts_input_backward") + out["experts_weight_backward"]
    out["combine"] = out["dispatch"]
    tier = cluster.tiers[-1] if cluster.tiers else None
    out["alpha"] = tier.latency_s if tier is not None else 0.0
    return out


def plan_ep_chunks(model: nn.Module, tokens: int, cluster=None) -> list[tuple[str, int, str]]:
    """Choose each EP layer's micro-chunk count from the cost model (`cost_model.ep_chunks.choose_chunks` on
    `price_ep_layer`'s times for `tokens` tokens per rank) and set it on the module for the next capture.

    `cluster`: what the exchanges are priced on; default the emulated link when this process emulates one
    (`TREX_EMULATE_LINK`), else the `cpu` cluster. Returns (module name, chunks, reason) per layer: the
    decision with its reason (the chunked layer's graph then shows the split it made)."""
    from trex.cost_model.ep_chunks import CHUNK_CHOICES, choose_chunks

    if cluster is None:
        from trex.runtime.emulated_link import current_link

        link = current_link()
        if link is not None:
            cluster = link.cluster("cpu")
        else:
            from trex.cost_model.annotate import cluster_of

            cluster = cluster_of("cpu")
    from trex.integrations.transformers_moe import experts_modules

    top_k = int(getattr(getattr(model, "config", None), "num_experts_per_tok", 1) or 1)
    decisions = []
    for name, module in experts_modules(model):
        if not hasattr(module, "trex_ep_layout"):
            continue
        times = price_ep_layer(module, tokens, top_k, cluster)
        by_chunks = {}  # each count's experts priced at its chunks' rows, n calls (what the chunked graph will hold)
        for n in CHUNK_CHOICES:
            if n <= tokens:
                part = price_ep_layer(module, -(-tokens // n), top_k, cluster)
                by_chunks[n] = (
                    n * part["experts"],
                    n * part["experts_backward"],
                    n * part["experts_weight_backward"],
                )
        choice = choose_chunks(
            times["dispatch"],
            times["experts"],
            times["combine"],
            times["alpha"],
            times["counts"],
            max_chunks=tokens,
            experts_backward_s=times["experts_backward"],
            extra_chunk_s=times["extra_chunk"],
            experts_by_chunks=by_chunks,
            experts_weight_backward_s=times["experts_weight_backward"],
        )
        module.trex_ep_chunks = choice.chunks
        module.trex_ep_chunk_reason = choice.reason
        decisions.append((name, choice.chunks, choice.reason))
    return decisions


# ---------------------------------------------------------------------------------------------
# transformers experts modules -> the distributed op


def ep_experts_forward(self: nn.Module, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
    """The "trex_ep" experts implementation: `routed_experts_ep` over the module's EP group."""
    layout = self.trex_ep_layout
    return routed_experts_ep(
        hidden_states,
        top_k_index,
        top_k_weights,
        self.gate_up_proj,
        self.down_proj,
        layout.activation,
        layout.swiglu_limit,
        layout.weights_transposed,
        self.trex_ep_group,
        self.trex_ep_size,
        getattr(self, "trex_ep_chunks", 1),
    )


def shard_experts(model: nn.Module, group: dist.ProcessGroup) -> list[str]:
    """Keep this rank's E/ep experts of every experts module and route them through the expert-parallel layer
    (`routed_experts_ep`).

    Returns the names of the expert parameters (their gradients reduce over the expert-data-parallel group).
    """
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from trex.integrations.transformers_moe import experts_layout, experts_modules

    ep, ep_rank = dist.get_world_size(group), dist.get_rank(group)
    if IMPLEMENTATION_NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION_NAME, ep_experts_forward)
    names = []
    for name, module in experts_modules(model):
        layout = experts_layout(module)
        if layout.unsupported_reason is not None:
            raise TrexError(
                f"expert parallelism needs the fused trex experts op, but {name} cannot use it: "
                f"{layout.unsupported_reason}; "
                "run this model with ep=1"
            )
        experts = module.gate_up_proj.size(0)
        if experts % ep:
            raise TrexError(f"ep={ep} does not divide the {experts} experts of {name}")
        local = experts // ep
        for attr in ("gate_up_proj", "down_proj"):
            full = getattr(module, attr)
            setattr(
                module,
                attr,
                nn.Parameter(
                    full.detach()[ep_rank * local : (ep_rank + 1) * local].clone(), requires_grad=full.requires_grad
                ),
            )
            names.append(f"{name}.{attr}" if name else attr)
        module.trex_ep_layout = layout
        module.trex_ep_group = group.group_name
        module.trex_ep_size = ep
    route_through_ep(model)
    return names


def route_through_ep(model: nn.Module) -> None:
    """Select the "trex_ep" experts implementation (again after `trex.compile`, which selects "trex")."""
    from trex.integrations.transformers_moe import experts_modules

    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(IMPLEMENTATION_NAME)
    else:
        for _, module in experts_modules(model):
            module.config._experts_implementation = IMPLEMENTATION_NAME


def parse_ep_chunks(text: str) -> int | None:
    """`--ep-chunks`: "auto" -> None (the cost model chooses), else a positive micro-chunk count."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        chunks = int(text)
    except ValueError:
        chunks = 0
    if chunks < 1:
        raise TrexError(f"--ep-chunks must be 'auto' or a positive integer, got {text!r}")
    return chunks


def choose_ep_chunks(model: nn.Module, setting: str, tokens: int, compiled: bool) -> list[str]:
    """Set every EP layer's micro-chunk count for `trex train` and return one note per layer saying why.

    "auto": with `compiled` (where reorder_comm schedules the exchanges) the cost model's choice for `tokens`
    tokens per rank and micro-batch (`plan_ep_chunks`, on the emulated link when one is set); an eager run
    keeps one chunk. A count: that many chunks everywhere (capped by the rows at run time)."""
    from trex.integrations.transformers_moe import experts_modules

    chunks = parse_ep_chunks(setting)
    if chunks is None and compiled:
        return [f"ep micro-chunks {name}: {n} ({reason})" for name, n, reason in plan_ep_chunks(model, tokens)]
    chunks = chunks or 1
    notes = []
    for name, module in experts_modules(model):
        if hasattr(module, "trex_ep_layout"):
            module.trex_ep_chunks = chunks
            module.trex_ep_chunk_reason = "set by --ep-chunks" if setting != "auto" else "eager run: one chunk"
            notes.append(f"ep micro-chunks {name}: {chunks} ({module.trex_ep_chunk_reason})")
    return notes
