"""Continuous batching for the local CPU worker: the engine loop the simulator models, run for real.

One engine thread owns the model. Its loop is the simulator's (`simulator.Simulation`) step for
step, so the simulator - priced with this engine's own profile (`trex serve profile`) - predicts
what the worker does:

* prefill first: while requests wait and fewer than `max_num_seqs` sequences run, the oldest
  waiting prompt is prefilled alone (one prompt per prefill step: `EngineLimits.max_prefill_seqs
  = 1`); its first token is emitted at the end of that step;
* otherwise one decode step over every running sequence: each gains one token; a sequence that
  has its `max_tokens` leaves the batch.

The batch's KV cache is one left-padded tensor pair per layer (batch, heads, longest context, head
dim) with a 2-D attention mask, so sequences of different lengths decode in one forward pass;
each sequence's RoPE position is its own length (`position_ids`). The tensors live in buffers with
room to grow (`preallocated_layer`): a decode step writes its new column in place, as serving
engines' preallocated KV caches do, instead of transformers' `DynamicLayer` concatenating - which
reallocates and copies the whole cache every step, a cost that grows faster than the context once
the copies leave the CPU's caches. When sequences join or leave, the cache is re-packed (valid
entries stay right-aligned, so a sequence's cache is the last `context` columns of its row). Greedy decoding: the tokens equal batch-1 generation's
(`TinyEngine.generate`), which the tests check.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from trex.workloads.serving.errors import ServingError


@dataclass
class BatchedRequest:
    """A request inside the engine: its prompt, how many tokens it wants, where tokens go."""

    prompt_ids: list[int]
    max_tokens: int
    on_token: Callable[[int], None] | None = None
    on_done: Callable[[list[int] | BaseException], None] | None = None
    tokens: list[int] = field(default_factory=list)
    kv: list | None = None  # per layer (keys, values) of shape (1, heads, context, dim), before joining the batch
    cancelled: bool = False  # the client went away: the sequence leaves at the next step
    tag: str = ""  # the client's label (OpenAI `user`), so a timeline can be matched to the request sent
    # the request's timeline on this engine (time.perf_counter: CLOCK_MONOTONIC, comparable across processes)
    submitted_s: float = 0.0
    prefill_start_s: float = 0.0
    token_s: list[float] = field(default_factory=list)  # when each token was emitted

    @property
    def context(self) -> int:
        """Tokens in this sequence's KV cache: the prompt and every generated token but the last."""
        return len(self.prompt_ids) + len(self.tokens) - 1

    @property
    def finished(self) -> bool:
        return self.cancelled or len(self.tokens) >= self.max_tokens


TIMELINE_LENGTH = 100_000  # steps and finished requests an engine remembers for `/trex/timeline`
ROOM = 64  # columns a re-packed cache can grow by before its buffers are reallocated (doubling)


def preallocated_layer(keys, values, room: int = ROOM):
    """A transformers cache layer holding `keys`/`values` (batch, heads, width, dim) in buffers with
    `room` spare columns; `update` writes new columns in place and returns views of the filled part."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def __init__(self):
            super().__init__()
            self.width = 0
            self.key_buffer = self.value_buffer = None
            self.device = keys.device
            self.is_initialized = True
            self._store(keys, values, room)

        def _store(self, new_keys, new_values, spare: int) -> None:
            batch, heads, width, dim = new_keys.shape
            self.key_buffer = new_keys.new_empty((batch, heads, width + spare, dim))
            self.value_buffer = new_values.new_empty((batch, heads, width + spare, new_values.shape[3]))
            self.key_buffer[:, :, :width] = new_keys
            self.value_buffer[:, :, :width] = new_values
            self.width = width
            self.keys, self.values = self.key_buffer[:, :, :width], self.value_buffer[:, :, :width]

        def update(self, key_states, value_states, *args, **kwargs):
            added = key_states.shape[-2]
            if self.width + added > self.key_buffer.shape[2]:
                self._store(self.keys, self.values, max(self.width, added))
            end = self.width + added
            self.key_buffer[:, :, self.width : end] = key_states
            self.value_buffer[:, :, self.width : end] = value_states
            self.width = end
            self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
            return self.keys, self.values

    return PreallocatedLayer()


class DecodeBatch:
    """The running sequences and their left-padded KV cache."""

    def __init__(self, torch):
        self.torch = torch
        self.sequences: list[BatchedRequest] = []
        self.keys: list = []  # per layer: (batch, heads, width, dim)
        self.values: list = []
        self.width = 0
        self.cache = None  # the transformers cache over preallocated buffers, rebuilt at each re-pack

    def __len__(self) -> int:
        return len(self.sequences)

    def repack(self, joining: list[BatchedRequest]) -> None:
        """Drop finished sequences, add `joining` ones, and pad every row to the longest context."""
        torch = self.torch
        pieces = []  # (sequence, per-layer keys, per-layer values) with exactly `context` columns
        for row, seq in enumerate(self.sequences):
            if seq.finished:
                continue
            n = seq.context
            pieces.append(
                (
                    seq,
                    [k[row : row + 1, :, self.width - n :] for k in self.keys],
                    [v[row : row + 1, :, self.width - n :] for v in self.values],
                )
            )
        for seq in joining:
            pieces.append((seq, [k for k, _ in seq.kv], [v for _, v in seq.kv]))
            seq.kv = None
        self.sequences = [seq for seq, _, _ in pieces]
        if not pieces:
            self.keys, self.values, self.width, self.cache = [], [], 0, None
            return
        self.width = max(seq.context for seq in self.sequences)
        layers = len(pieces[0][1])

        def padded(tensor):
            missing = self.width - tensor.shape[2]
            if not missing:
                return tensor
            pad = torch.zeros((1, tensor.shape[1], missing, tensor.shape[3]), dtype=tensor.dtype, device=tensor.device)
            return torch.cat([pad, tensor], dim=2)

        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=[(None, None)] * layers)
        cache.layers = [
            preallocated_layer(
                torch.cat([padded(p[1][layer]) for p in pieces]), torch.cat([padded(p[2][layer]) for p in pieces])
            )
            for layer in range(layers)
        ]
        self.cache = cache
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]

    def decode(self, model) -> list[int]:
        """One forward pass: every sequence's last token in, its next token out; the cache grows by one column."""
        torch = self.torch
        batch = len(self.sequences)
        contexts = torch.tensor([seq.context for seq in self.sequences])
        mask = torch.zeros((batch, self.width + 1), dtype=torch.long)
        columns = torch.arange(self.width + 1)
        mask[columns.unsqueeze(0) >= (self.width - contexts).unsqueeze(1)] = 1
        result = model(
            input_ids=torch.tensor([[seq.tokens[-1]] for seq in self.sequences]),
            attention_mask=mask,
            position_ids=contexts.unsqueeze(1),
            cache=self.cache,
            use_cache=True,
        )
        self.keys = [layer.keys for layer in self.cache.layers]
        self.values = [layer.values for layer in self.cache.layers]
        self.width += 1
        return [int(t) for t in result.logits[:, -1].argmax(dim=-1)]


class BatchingEngine:
    """The engine thread: prefill-first continuous batching of up to `max_num_seqs` sequences."""

    def __init__(self, model, torch, *, max_num_seqs: int = 16, threads: int | None = None, warm_up_context: int = 0):
        if max_num_seqs < 1:
            raise ServingError(f"max_num_seqs must be at least 1 (got {max_num_seqs})")
        if warm_up_context < 0:
            raise ServingError(f"the warm-up context must be >= 0 tokens (got {warm_up_context})")
        # grow the engine thread's heap once, before serving: a full batch of ragged sequences up to this many
        # tokens (`warm_up`); with `host_memory.keep_freed_memory` later steps reuse that memory instead of
        # faulting fresh pages in (0: no warm-up)
        self.warm_up_context = warm_up_context
        self.ready = threading.Event()  # set once the warm-up (if any) is done
        self.warm_up_faults: list[int] = []  # minor page faults of each warm-up round
        if not warm_up_context:
            self.ready.set()
        self.model, self.torch = model, torch
        self.max_num_seqs, self.threads = max_num_seqs, threads
        self.waiting: deque[BatchedRequest] = deque()
        self.batch = DecodeBatch(torch)
        self.joining: list[BatchedRequest] = []
        self.wake = threading.Condition()
        self.stopped = False
        self.steps = {"prefill": 0, "decode": 0}
        self.cpu_s = 0.0  # the engine thread's CPU time in steps: what the profile's clock measures
        self.busy_s = 0.0  # wall time in steps: CPU time stretched by whatever else wants the cores
        self.thread: threading.Thread | None = None
        # what a live bench compares with the simulator's timeline (bounded: a long-running worker keeps the last)
        self.step_log: deque = deque(maxlen=TIMELINE_LENGTH)  # (kind, start, end, cpu, seqs, context, width, repacked)
        self.timeline: deque = deque(maxlen=TIMELINE_LENGTH)  # finished requests: (tag, prompt, max_tokens,
        # submitted, prefill start, first token, last token)

    # -- the two steps (also what `trex serve profile` times) ------------------------------------------
    def prefill(self, request: BatchedRequest) -> None:
        """Run the prompt alone; keep its KV cache for the batch and emit its first token."""
        torch = self.torch
        result = self.model(input_ids=torch.tensor([request.prompt_ids]), use_cache=True)
        request.kv = [(layer.keys, layer.values) for layer in result.cache.layers]
        self._emit(request, int(result.logits[0, -1].argmax()))

    def decode(self) -> bool:
        """Re-pack the batch if sequences joined or left, then one decode step over all of it; True if it
        re-packed."""
        repacked = bool(self.joining or any(seq.finished for seq in self.batch.sequences))
        if repacked:
            self.batch.repack(self.joining)
            self.joining = []
        if not len(self.batch):
            return repacked
        for seq, token in zip(list(self.batch.sequences), self.batch.decode(self.model)):
            self._emit(seq, token)
        return repacked

    def _emit(self, request: BatchedRequest, token: int) -> None:
        request.tokens.append(token)
        request.token_s.append(time.perf_counter())
        if request.on_token is not None:
            request.on_token(token)
        if request.finished:
            if not request.cancelled:
                self.timeline.append(
                    (request.tag, len(request.prompt_ids), request.max_tokens, request.submitted_s)
                    + (request.prefill_start_s, request.token_s[0], request.token_s[-1])
                )
            if request.on_done is not None and not request.cancelled:
                request.on_done(list(request.tokens))
        elif request.kv is not None:
            self.joining.append(request)

    @property
    def running(self) -> int:
        return sum(not seq.finished for seq in (*self.joining, *self.batch.sequences))

    # -- the loop -----------------------------------------------------------------------------------
    def submit(self, request: BatchedRequest) -> None:
        if not request.prompt_ids or request.max_tokens < 1:
            raise ServingError("a request needs at least one prompt token and max_tokens >= 1")
        with self.wake:
            if self.stopped:
                raise ServingError("the engine has stopped")
            request.submitted_s = time.perf_counter()
            self.waiting.append(request)
            self.wake.notify()
        if self.thread is None:
            self.start()

    def start(self) -> None:
        with self.wake:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="batching-engine", daemon=True)
                self.thread.start()

    def step(self) -> bool:
        """One engine step; False when there was nothing to do. Each step is logged (`step_log`): its kind,
        wall start and end, CPU time, sequences, context tokens, padded width, and whether it re-packed."""
        with self.wake:
            while self.waiting and self.waiting[0].cancelled:
                self.waiting.popleft()
            request = self.waiting.popleft() if self.waiting and self.running < self.max_num_seqs else None
        start, cpu = time.perf_counter(), time.thread_time()
        if request is not None:
            self.steps["prefill"] += 1
            request.prefill_start_s = start
            try:
                self.prefill(request)
            except Exception:
                if request.kv is None and not request.finished:  # it joined nothing: fail it with the rest
                    self.joining.append(request)
                raise
            tokens = len(request.prompt_ids)
            self.step_log.append(("prefill", start, time.perf_counter(), time.thread_time() - cpu, 1, tokens, 0, False))
            return True
        if self.running:
            self.steps["decode"] += 1
            repacked = self.decode()
            seqs = len(self.batch)
            # the tokens each sequence attended over (its cache and the new one: the simulator's context) and the
            # padded batch's: every row is as wide as the longest
            context = sum(seq.context for seq in self.batch.sequences)
            width = seqs * self.batch.width
            self.step_log.append(
                ("decode", start, time.perf_counter(), time.thread_time() - cpu, seqs, context, width, repacked)
            )
            return True
        return False

    def warm_up(self, context: int, max_rounds: int = 6) -> list[int]:
        """Grow this thread's heap to what serving will use, then stop: rounds of a throw-away batch served as the
        engine serves - `max_num_seqs` prompts of ragged lengths up to `context` tokens, each prefilled while the
        batch decodes beside it and joining it at the next decode step (so a prefill's activations and every
        re-pack's new buffers are allocated while the previous batch's are alive, as in service; prefilling every
        prompt first, as an earlier warm-up did, left the heap short of that peak and the first large batches in
        service faulted it in: 31,793 pages in one rehearsal), then leaving one per step - until a round faults
        under 1% of the first round's pages in (or `max_rounds`). glibc gives each thread its own heap (arena), so
        this runs on the engine thread. Returns the minor page faults of each round."""
        import resource

        faults = []
        n = self.max_num_seqs
        for _ in range(max_rounds):
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            scratch = BatchingEngine(self.model, self.torch, max_num_seqs=n)
            for i in range(n):  # longest prompt last: its prefill runs beside the fullest batch
                length = max(1, round(context * (i + 1) / n))
                scratch.prefill(BatchedRequest([0] * length, n + 2 + i))  # all stay until the batch is full
                scratch.decode()
            while scratch.running:
                scratch.decode()
            del scratch
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
            if len(faults) > 1 and faults[-1] <= 0.01 * faults[0]:
                break
        self.warm_up_faults = faults
        return faults

    def _loop(self) -> None:
        if self.threads:
            self.torch.set_num_threads(self.threads)
        with self.torch.inference_mode():
            try:
                if self.warm_up_context:
                    self.warm_up(self.warm_up_context)
            finally:
                self.ready.set()
            while True:
                with self.wake:
                    while not self.stopped and not self.waiting and not self.running:
                        self.wake.wait()
                    if self.stopped:
                        break
                cpu, wall = time.thread_time(), time.perf_counter()
                try:
                    self.step()
                except Exception as error:  # a failed step fails the requests in it, never silently
                    self._fail_all(error)
                finally:
                    self.cpu_s += time.thread_time() - cpu
                    self.busy_s += time.perf_counter() - wall

    def _fail_all(self, error: BaseException) -> None:
        with self.wake:
            victims = [*self.waiting, *self.joining, *(s for s in self.batch.sequences if not s.finished)]
            self.waiting.clear()
            self.joining = []
            self.batch = DecodeBatch(self.torch)
        for request in victims:
            if request.on_done is not None:
                request.on_done(error)

    def stop(self) -> None:
        with self.wake:
            self.stopped = True
            self.wake.notify_all()
        self._fail_all(ServingError("the worker is shutting down"))
