"""Differential test: 3,000 generated expressions and start times, against the fire times
Quartz 2.3.2 itself computed (tests/unit/quartz/cases.json, made by
``python -m tests.unit.quartz.generate`` with Debian's libquartz2-java). UTC only: daylight
saving time is where celery_ratchet follows the Ratchet seeds instead of Quartz."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_ratchet.domain.cron import CronError, CronExpression
from tests.conftest import IN_CI
from tests.unit.quartz import generate

CASES = json.loads((Path(__file__).parent / "quartz" / "cases.json").read_text())
#: Quartz's parser cannot read a range mixing a name and a number ("3-JUL", "FRI-7"); ours
#: can, and gives it the obvious meaning.
MIXED_RANGE = re.compile(r"(\d-[A-Z]|[A-Z]-\d)")
#: "nW" for a day some months lack (29W-31W): Quartz lets java.util.Calendar roll the day into
#: the next month and then takes the weekday nearest that (31W in June 2017 fired on Friday
#: June 30, because July 1 was a Saturday); ours never leaves the month and skips months too
#: short for the day. Parsing is still compared.
SHORT_MONTH_WEEKDAY = re.compile(r"^\S+ \S+ \S+ (29|30|31)W ")
#: The live comparison's cases: the same every run in CI (a landing never waits on a chance
#: draw), fresh on a developer's machine, where a new difference is worth finding.
LIVE_SEED = 20261201 if IN_CI else int(datetime.now().timestamp())


def _replay(case: dict[str, object]) -> None:
    expression = str(case["expression"])
    if case["quartz"] is None:
        if MIXED_RANGE.search(expression):
            # Quartz stopped at the mixed range; ours reads it and may still find another
            # problem (a step too large), or none.
            try:
                CronExpression(expression, str(case["zone"]))
            except CronError as exc:
                assert "step" in str(exc)
            return
        with pytest.raises(CronError):
            CronExpression(expression, str(case["zone"]))
        return
    cron = CronExpression(expression, str(case["zone"]))
    if SHORT_MONTH_WEEKDAY.search(expression):
        return
    start = datetime.fromtimestamp(int(case["start_ms"]) / 1000, timezone.utc)  # type: ignore[call-overload]
    ours = [int(t.timestamp() * 1000) for t in cron.fire_times(start, int(case["count"]))]  # type: ignore[call-overload]
    assert ours == case["quartz"], f"{expression} after {start.isoformat()}"


def test_every_recorded_case_matches_quartz() -> None:
    assert len(CASES) >= 3000
    for case in CASES:
        _replay(case)


def test_fresh_cases_match_quartz_live() -> None:
    if not generate.quartz_available():
        reason = "Quartz 2.3.2 / java not installed (Debian: libquartz2-java, default-jdk-headless)"
        if IN_CI:
            pytest.fail(f"{reason}: CI installs them (.ci/run)")
        pytest.skip(reason)
    for case in generate.cases(300, seed=LIVE_SEED):
        _replay(case)
