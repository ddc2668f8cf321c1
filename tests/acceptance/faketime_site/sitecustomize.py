"""Loaded first by a process run under libfaketime (tests/acceptance/test_clock_skew.py):
libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC makes time.sleep fail (EINVAL from its
clock_nanosleep); a select() with a timeout sleeps the same on the unfaked monotonic clock."""

from __future__ import annotations

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    select.select([], [], [], seconds)


time.sleep = _sleep
