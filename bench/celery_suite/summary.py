"""summary.py RUN.xml [OTHER.xml]: a run's passed/failed/skipped counts from its junit XML,
then its failures (and, given OTHER, its skips that passed there), each with its message."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

KINDS = {"failure": "failed", "error": "error", "skipped": "skipped"}


def load(path: str) -> dict[str, tuple[str, str]]:
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kind, message = "passed", ""
        for child in case:
            if child.tag in KINDS:
                kind = KINDS[child.tag]
                message = (child.get("message") or "").split("\n")[0][:160]
                if kind != "skipped":
                    break
        if outcomes.get(name, ("",))[0] in ("failed", "error"):
            continue  # a test's failure stands over its teardown's or subtests' entries
        outcomes[name] = (kind, message)
    return outcomes


def main() -> None:
    run = load(sys.argv[1])
    other = load(sys.argv[2]) if len(sys.argv) > 2 else {}
    counts: dict[str, int] = {}
    for kind, _ in run.values():
        counts[kind] = counts.get(kind, 0) + 1
    print(sys.argv[1], counts)
    for name, (kind, message) in sorted(run.items()):
        passed_there = other.get(name, ("",))[0] == "passed"
        if kind in ("failed", "error") or (kind == "skipped" and passed_there):
            print(f"{kind:7} {other.get(name, ('?',))[0]:7} {name}  {message}")


if __name__ == "__main__":
    main()
