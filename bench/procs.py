"""The machine's processes as /proc shows them, for benches that measure a process tree."""

from __future__ import annotations

from pathlib import Path


def children() -> dict[int, list[int]]:
    """Each running process's children, by parent pid."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found.setdefault(ppid, []).append(int(entry.name))
    return found
