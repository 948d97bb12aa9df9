"""Keep the memory a CPU worker frees, so a step costs the same whenever it runs.

A local CPU worker's steps allocate and free tensors of the batch's size every step: the re-packed
KV cache (one tensor pair per layer), activations, logits. glibc's malloc hands large freed blocks
back to the kernel - blocks above its mmap threshold are unmapped on free, and free memory at the
top of a heap is trimmed - so the next step of that size faults every page in again (a minor page
fault per 4 KiB, the kernel zeroing each page, all counted in the thread's CPU time). Measured on
the live bench's 8x768 worker (8 layers, hidden 768), a decode step of 14 ragged sequences after a
re-pack: 258 ms and 31,800 minor faults the first time, then 168-229 ms and 15,000-16,700 faults on
every later round with the batch sizes cycling (B = 2: 62-94 ms and no faults once grown). So a
step's CPU depended on the worker's allocation history - larger batches more - and the profile, which
repeats each shape until its memory is reused, measured the cheap case: the live bench's large
batches cost up to 2x their profile (bench/RESULTS.md section 8, fourth and fifth sessions).

`keep_freed_memory` sets glibc's tunables the way a serving engine's preallocated pools behave: a fixed
mmap threshold at its maximum (32 MiB on 64-bit, so the dynamic threshold no longer moves and every
block up to it comes from the heap) and a trim threshold that is never reached (freed memory stays
mapped for the next step). With `BatchingEngine(warm_up=...)` growing the engine thread's heap once at
start, steady-state steps fault nothing. The profile (`trex serve profile`) runs under the same settings,
so it prices what the worker runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: 2 GiB of free heap top before any trim

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Make this process keep freed heap memory (glibc malloc); True if applied, False where malloc is not
    glibc's (the process runs as before). Idempotent."""
    global _applied
    if _applied is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            _applied = False
        else:
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
                mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)
            )
    return _applied
