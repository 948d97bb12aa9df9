"""Pipeline schedules, run by `torch.distributed.pipelining` (the engine; trex picks and checks).

  gpipe        all forwards, then all backwards (Huang et al. 2019)               ScheduleGPipe
  1f1b         one forward, one backward in the steady state (Narayanan et al. 2021) Schedule1F1B
  interleaved  1F1B over vpp chunks per stage, loop placement (Narayanan et al. 2021) ScheduleInterleaved1F1B
  zbv          zero-bubble V schedule, backward split into input and weight gradients (Qi et al. 2023)
                                                                                    ScheduleZBVZeroBubble
  dualpipev    DeepSeek's DualPipe folded into a V (DeepSeek-V3 report, 2024)     ScheduleDualPipeV

The V schedules run two chunks per stage in the V placement (`split.chunk_rank`). Every schedule is
built with `scale_grads=False`: the loss of each micro-batch is already divided by the tokens of the
global batch, so the summed gradients are the 1-rank run's.
"""

from __future__ import annotations

from collections.abc import Callable

from trex.errors import TrexError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")


class ScheduleError(TrexError):
    """A schedule that cannot run this plan; the message has the numbers and the fix."""


def default_schedule(vpp: int) -> str:
    """What runs when neither --schedule nor the planner names one: 1F1B, interleaved with vpp > 1."""
    return "1f1b" if vpp == 1 else "interleaved"


def placement_of(schedule: str) -> str:
    return "v" if schedule in V_SCHEDULES else "loop"


def schedule_problems(schedule: str, pp: int, vpp: int, microbatches: int) -> list[str]:
    """Why `schedule` cannot run pp stages of vpp chunks on `microbatches` micro-batches (empty: it can)."""
    if schedule not in SCHEDULES:
        return [f"unknown --schedule {schedule!r}; use one of {', '.join(SCHEDULES)}"]
    problems = []
    if schedule == "1f1b" and microbatches < pp:
        problems.append(
            f"--schedule 1f1b needs at least as many micro-batches as stages: {microbatches} < pp={pp} (raise gbs, "
            "lower mbs, or use gpipe)"
        )
    if schedule in ("gpipe", "1f1b") and vpp != 1:
        problems.append(f"--schedule {schedule} runs one chunk per stage; the plan has vpp={vpp} (use interleaved)")
    if schedule == "interleaved":
        if vpp < 2:
            problems.append(f"--schedule interleaved needs vpp >= 2 chunks per stage; the plan has vpp={vpp}")
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            problems.append(
                f"interleaved 1F1B runs the {microbatches} micro-batches in rounds of pp={pp}: {microbatches} is not "
                f"a multiple of {rounds} rounds; use a multiple of pp micro-batches (gbs / (mbs*dp))"
            )
    if schedule in V_SCHEDULES and vpp != 2:
        problems.append(f"--schedule {schedule} runs exactly 2 chunks per stage (a V); the plan has vpp={vpp}")
    if schedule == "dualpipev" and microbatches < 2 * pp:
        problems.append(
            f"--schedule dualpipev needs at least as many micro-batches as chunks (2*pp = {2 * pp}); there are "
            f"{microbatches} (raise gbs or lower mbs)"
        )
    return problems


def check_schedule(schedule: str, pp: int, vpp: int, microbatches: int) -> None:
    problems = schedule_problems(schedule, pp, vpp, microbatches)
    if problems:
        raise ScheduleError("; ".join(problems))


def build_schedule(schedule: str, stages: list, microbatches: int, loss_fn: Callable):
    """The engine's schedule object over this rank's `PipelineStage`s (model order)."""
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleDualPipeV,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleZBVZeroBubble,
    )

    if schedule in ("gpipe", "1f1b"):
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        return cls(stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)
    cls = {"interleaved": ScheduleInterleaved1F1B, "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}[
        schedule
    ]
    return cls(stages, microbatches, loss_fn=loss_fn, scale_grads=False)


def single_stage_actions(schedule: str, pp: int, microbatches: int) -> dict[int, list[tuple[str, int, int]]]:
    """The order in which the engine's one-chunk schedules run a rank's work (their `_step_microbatches`
    loops; their `pipeline_order`, kept for visualisation, is not what runs): GPipe all forwards then all
    backwards; 1F1B min(m, pp - rank) forwards, then backward and forward alternately, then the rest."""
    out = {}
    for rank in range(pp):
        forwards = [("F", rank, mb) for mb in range(microbatches)]
        backwards = [("B", rank, mb) for mb in range(microbatches)]
        if schedule == "gpipe":
            out[rank] = forwards + backwards
            continue
        warmup = min(microbatches, pp - rank)
        order = forwards[:warmup]
        rest = forwards[warmup:]
        for i, backward in enumerate(backwards):
            order.append(backward)
            if i < len(rest):
                order.append(rest[i])
        out[rank] = order
    return out


def compute_actions(schedule_object) -> dict[int, list[tuple[str, int, int]]]:
    """The schedule's per-rank compute actions (kind F/B/I/W, stage, micro-batch), for the cost model's
    event simulation: the engine's own action lists (`pipeline_order`) for the multi-chunk schedules,
    which its runtime executes; `single_stage_actions` for GPipe and 1F1B."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    if isinstance(schedule_object, (ScheduleGPipe, Schedule1F1B)):
        name = "gpipe" if isinstance(schedule_object, ScheduleGPipe) else "1f1b"
        return single_stage_actions(name, schedule_object._num_stages, schedule_object._n_microbatches)
    out: dict[int, list[tuple[str, int, int]]] = {}
    for rank, actions in (schedule_object.pipeline_order or {}).items():
        flat = []
        for action in actions:
            if action is None:
                continue
            for part in action.sub_actions or (action,):
                kind = part.computation_type.value
                if kind in ("F", "B", "I", "W"):
                    flat.append((kind, part.stage_index, part.microbatch_index))
        out[rank] = flat
    return out


def _lowered_comms(schedule_object, kinds: tuple[str, str]) -> dict[int, list[tuple[list, int]]]:
    """The engine's lowered action lists (`pipeline_order_with_comms`) read for the communication actions of
    `kinds` (("RECV_F", "RECV_B") or ("SEND_F", "SEND_B")): per rank, in order, (the compute actions the message
    belongs to - (kind, stage, micro-batch) candidates: a backward is B or I -, index of the rank's last compute
    action before it, -1 before any). Empty without lowered lists (GPipe's and 1F1B's own loops)."""
    lowered = getattr(schedule_object, "pipeline_order_with_comms", None) or {}
    out: dict[int, list[tuple[list, int]]] = {}
    for rank, actions in lowered.items():
        found: list[tuple[list, int]] = []
        computed = -1
        for action in actions:
            if action is None:
                continue
            kind = action.computation_type.value
            if kind in kinds:
                stage, mb = action.stage_index, action.microbatch_index
                candidates = [("F", stage, mb)] if kind == kinds[0] else [("B", stage, mb), ("I", stage, mb)]
                found.append((candidates, computed))
                continue
            for part in action.sub_actions or (action,):
                if part.computation_type.value in ("F", "B", "I", "W"):
                    computed += 1
        out[rank] = found
    return out


def receive_posts(schedule_object, orders: dict[int, list[tuple[str, int, int]]]) -> dict:
    """Where the engine posts each remote input's receive, for the cost model's rendezvous-link simulation
    (`simulate_actions(posts=...)`): per rank, (kind, stage, micro-batch) of a compute action -> index in the
    rank's `orders` of the compute action after which its receive is posted (-1: at the step's start).

    The multi-chunk schedules run the engine's lowered action lists (`pipeline_order_with_comms`), where a
    RECV is placed as early as the sender's action allows; GPipe's and 1F1B's loops post each receive just
    before the action that needs it, which is the simulation's default (no entry)."""
    out: dict[int, dict[tuple[str, int, int], int]] = {}
    for rank, found in _lowered_comms(schedule_object, ("RECV_F", "RECV_B")).items():
        mine = set(orders.get(rank, ()))
        out[rank] = {key: computed for candidates, computed in found for key in candidates if key in mine}
    return out


def send_posts(schedule_object, orders: dict[int, list[tuple[str, int, int]]]) -> dict:
    """Where the engine posts each send to another rank, for the cost model's simulation
    (`simulate_actions(sends=...)`): per rank, (kind, stage, micro-batch) of a compute action -> index in the
    rank's `orders` of the compute action after which its SEND is posted; only sends posted later than right
    after their own action are listed.

    In the engine's lowered action lists (`_add_send_recv`) a SEND follows the compute action that produced it,
    except in an overlapped forward and backward (DualPipeV's OVERLAP_F_B): both sends follow the pair, and the
    runtime runs the pair's two sub-actions one after the other - the forward's activation leaves only after the
    backward beside it (RESULTS 14.6). GPipe's and 1F1B's loops send right after each action (no entry)."""
    out: dict[int, dict[tuple[str, int, int], int]] = {}
    for rank, found in _lowered_comms(schedule_object, ("SEND_F", "SEND_B")).items():
        index = {action: i for i, action in enumerate(orders.get(rank, ()))}
        out[rank] = {
            key: computed
            for candidates, computed in found
            for key in candidates
            if key in index and index[key] != computed
        }
    return out
