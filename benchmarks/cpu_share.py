"""Give one process (and the children it starts later) its share of this host's CPUs.

    python -m benchmarks.cpu_share PID POSITION COUNT

The device drivers run one worker per GPU; each worker's trials compile with inductor's pool of
up to 32 processes (sized from the CPUs the process may use) while the other GPUs' trials are
timed. Pinned to disjoint shares, a worker's compile cannot take the CPU a neighbour's timed
steps launch kernels from. The host's allowed CPUs are split in order into COUNT equal parts;
POSITION picks one.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def share(cpus: Sequence[int], position: int, count: int) -> list[int]:
    """Part ``position`` of ``cpus`` split in order into ``count`` equal parts (the remainder
    unused; at least one CPU each)."""
    if not 0 <= position < count:
        raise ValueError(f"position {position} is not one of {count} parts")
    ordered = sorted(cpus)
    size = max(len(ordered) // count, 1)
    part = ordered[position * size : (position + 1) * size]
    return part or ordered[-1:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("pid", "position", "count"):
        parser.add_argument(name, type=int)
    args = parser.parse_args(argv)
    pid = args.pid
    try:
        cpus = share(os.sched_getaffinity(pid), args.position, args.count)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"cpu_share: {exc}\n")
    os.sched_setaffinity(pid, cpus)
    print(f"pid {pid}: CPUs {cpus[0]}-{cpus[-1]} ({len(cpus)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
