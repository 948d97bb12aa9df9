"""CPU time per sample of the OR data generator of a source tree, for before/after comparisons.

    git archive <base commit> | tar -x -C /tmp/base
    /work/bin/bench .venv/bin/python bench/or_data/generator_cpu.py /tmp/base /tmp/sp_base 91 40
    /work/bin/bench .venv/bin/python bench/or_data/generator_cpu.py $PWD /tmp/sp_mine 91 40

Runs `synthesize` (one worker, all families, the default configuration) from TREE's
`workloads/` and `trex_compiler/` through this checkout's editable install, so both trees run
in the same environment. CPU is the process plus its children from `getrusage` (a sandbox
that runs programs in another pid namespace is counted only as far as the kernel charges it
to the children; the same for both trees).
"""

from __future__ import annotations

import resource
import sys
import time


def main() -> int:
    tree, out, seed, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    import __editable___trex_compiler_0_1_0_finder as finder

    here = finder.MAPPING["trex"].rsplit("/", 1)[0]
    finder.MAPPING.update({key: value.replace(here, tree) for key, value in finder.MAPPING.items()})
    from trex.workloads.or_data import synthesis
    from trex.workloads.or_data.config import SynthConfig
    from trex.workloads.or_data.families import FAMILIES

    assert synthesis.__file__.startswith(tree), synthesis.__file__
    started = time.monotonic()
    synthesis.synthesize(SynthConfig(seed=seed, families=tuple(FAMILIES)), out, count, workers=1, progress=False)
    wall = time.monotonic() - started
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    print(f"{tree}: {count} samples, wall {wall:.1f} s, CPU {cpu:.1f} s, {1000 * cpu / count:.0f} ms CPU per sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
