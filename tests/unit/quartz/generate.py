"""Differential cases for the cron evaluator: random Quartz expressions and start times,
answered by Quartz 2.3.2 itself (Debian's libquartz2-java).

    python -m tests.unit.quartz.generate [--cases 3000] [--seed 7]

writes tests/unit/quartz/cases.json, which test_cron_quartz.py replays without Java.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
JARS = ["/usr/share/java/quartz2.jar", "/usr/share/java/slf4j-api.jar"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]


def quartz_available() -> bool:
    return all(Path(j).exists() for j in JARS) and _which("javac") and _which("java")


def _which(program: str) -> bool:
    from shutil import which

    return which(program) is not None


def _simple(rng: random.Random, low: int, high: int, names: list[str] | None = None) -> str:
    def value() -> str:
        v = rng.randint(low, high)
        if names and rng.random() < 0.4:
            return names[v - low]
        return str(v)

    kind = rng.choice(["*", "one", "range", "step", "star-step", "list", "range-step"])
    if kind == "*":
        return "*"
    if kind == "one":
        return value()
    if kind == "range":
        return f"{value()}-{value()}"  # may wrap
    if kind == "step":
        return f"{rng.randint(low, high)}/{rng.randint(1, high - low + 1)}"
    if kind == "star-step":
        return f"*/{rng.randint(1, max(1, (high - low) // 2))}"
    if kind == "range-step":
        a, b = sorted(rng.sample(range(low, high + 1), 2))
        return f"{a}-{b}/{rng.randint(1, 4)}"
    return ",".join(sorted({value() for _ in range(rng.randint(2, 4))}))


def _day_of_month(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:
        return "L"
    if kind < 0.25:
        return f"L-{rng.randint(1, 5)}"
    if kind < 0.35:
        return f"{rng.randint(1, 31)}W"
    if kind < 0.4:
        return "LW"
    return _simple(rng, 1, 31)


def _day_of_week(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:
        return f"{rng.choice([str(rng.randint(1, 7)), rng.choice(DAYS)])}L"
    if kind < 0.3:
        return f"{rng.randint(1, 7)}#{rng.randint(1, 5)}"
    return _simple(rng, 1, 7, DAYS)


def expression(rng: random.Random) -> str:
    second = _simple(rng, 0, 59) if rng.random() < 0.5 else str(rng.randint(0, 59))
    minute = _simple(rng, 0, 59)
    hour = _simple(rng, 0, 23)
    month = _simple(rng, 1, 12, MONTHS) if rng.random() < 0.5 else "*"
    if rng.random() < 0.5:
        dom, dow = _day_of_month(rng), "?"
    else:
        dom, dow = "?", _day_of_week(rng)
    fields = [second, minute, hour, dom, month, dow]
    if rng.random() < 0.2:
        start = rng.randint(2000, 2060)
        fields.append(rng.choice([str(start), f"{start}-{start + rng.randint(0, 20)}", "*"]))
    return " ".join(fields)


def ask_quartz(rows: list[tuple[str, str, int, int]]) -> list[str]:
    with tempfile.TemporaryDirectory() as build:
        subprocess.run(
            ["javac", "-cp", JARS[0], "-d", build, str(HERE / "QuartzOracle.java")], check=True
        )
        stdin = "".join(f"{e}\t{z}\t{t}\t{n}\n" for e, z, t, n in rows)
        done = subprocess.run(
            ["java", "-cp", ":".join([build, *JARS]), "QuartzOracle"],
            input=stdin,
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stdout.splitlines()


def cases(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        start_ms = rng.randint(946684800, 2208988800) * 1000 + rng.choice([0, 0, 0, 500])
        rows.append((expression(rng), "UTC", start_ms, 6))
    answers = ask_quartz(rows)
    out = []
    for (expr, zone, start_ms, n), answer in zip(rows, answers, strict=True):
        status, _, payload = answer.partition("\t")
        out.append(
            {
                "expression": expr,
                "zone": zone,
                "start_ms": start_ms,
                "count": n,
                "quartz": None if status == "ERROR" else [int(t) for t in payload.split(",") if t],
                "quartz_error": payload if status == "ERROR" else None,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    found = cases(args.cases, args.seed)
    (HERE / "cases.json").write_text(json.dumps(found, indent=0) + "\n")
    errors = sum(1 for c in found if c["quartz"] is None)
    print(f"wrote {len(found)} cases ({errors} rejected by Quartz)")


if __name__ == "__main__":
    main()
