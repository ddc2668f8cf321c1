"""Workers left over from an interrupted bench run: they drain the same queues and bump the
same counters, so every figure would count their jobs too."""

from __future__ import annotations

import time
from pathlib import Path


def bench_workers() -> list[int]:
    """Pids of workers of the bench's apps running now (this bench's or any other's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker" in argv and any(a.startswith(b"bench.apps:") for a in argv):
                found.append(int(entry.name))
    return found


def refuse_strays(grace: float = 10.0) -> None:
    """Raise while another bench worker runs; a stopped worker's pool processes may outlive
    it by a moment, so they get ``grace`` seconds to go."""
    deadline = time.monotonic() + grace
    while (strays := bench_workers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if strays:
        raise RuntimeError(
            f"bench workers already running (pids {', '.join(map(str, strays))}): stop them "
            "first, or their jobs are counted in these figures"
        )
