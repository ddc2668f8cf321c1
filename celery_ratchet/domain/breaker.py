"""Circuit breakers per service name. Pure: ``now`` (seconds, monotonic) is passed in.

CLOSED counts the last ``window`` outcomes; once at least ``minimum_calls`` are in and the
share of failures reaches ``failure_rate``, the breaker OPENs for ``open_seconds``: jobs for
the service are deferred (not failed, not counted as attempts). Then it is HALF_OPEN: one
probe job runs; its success closes the breaker, its failure opens it again. A probe whose
outcome never arrives is given up after ``open_seconds`` and another one is let through.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class BreakerState(str, enum.Enum):
    CLOSED = "CLOSED"
    OPEN = "OPEN"
    HALF_OPEN = "HALF_OPEN"


@dataclass(frozen=True)
class BreakerConfig:
    failure_rate: float = 0.5
    window: int = 100
    open_seconds: float = 30.0
    #: Outcomes needed before the rate means anything; default min(window, 10).
    minimum_calls: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.failure_rate <= 1:
            raise ValueError(f"failure_rate must be within (0, 1], got {self.failure_rate!r}")
        if self.window < 1:
            raise ValueError(f"window must be at least 1, got {self.window!r}")
        if self.open_seconds <= 0:
            raise ValueError(f"open_seconds must be positive, got {self.open_seconds!r}")
        if self.minimum_calls is not None and not 1 <= self.minimum_calls <= self.window:
            raise ValueError(f"minimum_calls must be within 1..window, got {self.minimum_calls}")

    @property
    def calls_needed(self) -> int:
        return self.minimum_calls if self.minimum_calls is not None else min(self.window, 10)


#: How long jobs wait while a half-open breaker's probe runs.
PROBE_WAIT_SECONDS = 1.0


@dataclass
class CircuitBreaker:
    config: BreakerConfig
    state: BreakerState = BreakerState.CLOSED
    opened_until: float = 0.0
    probe_started: float | None = None
    _outcomes: deque[bool] = field(default_factory=deque)  # True = failure
    _failures: int = 0

    def defer_until(self, now: float) -> float | None:
        """None: run the job now (while HALF_OPEN, as the probe). Else the time (same clock
        as ``now``) to try it again."""
        if self.state is BreakerState.OPEN:
            if now < self.opened_until:
                return self.opened_until
            self.state = BreakerState.HALF_OPEN
            self.probe_started = None
        if self.state is BreakerState.HALF_OPEN:
            probe_lost = (
                self.probe_started is not None
                and now - self.probe_started >= self.config.open_seconds
            )
            if self.probe_started is None or probe_lost:
                self.probe_started = now
                return None
            return now + min(PROBE_WAIT_SECONDS, self.config.open_seconds)
        return None

    def record(self, failed: bool, now: float, *, probe: bool = False) -> None:
        """Count one outcome. While HALF_OPEN only the probe's counts (``probe=True``: the
        job admitted by :meth:`defer_until` in that state); a job started earlier, finishing
        late, decides nothing."""
        if self.state is BreakerState.HALF_OPEN:
            if not probe:
                return
            if failed:
                self._open(now)
            else:
                self._close()
            return
        if self.state is BreakerState.OPEN:
            return  # a job started before the breaker opened: its outcome is old news
        self._outcomes.append(failed)
        self._failures += failed
        if len(self._outcomes) > self.config.window:
            self._failures -= self._outcomes.popleft()
        calls = len(self._outcomes)
        if calls >= self.config.calls_needed and self._failures / calls >= self.config.failure_rate:
            self._open(now)

    def failure_rate(self) -> float:
        return self._failures / len(self._outcomes) if self._outcomes else 0.0

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_until = now + self.config.open_seconds
        self.probe_started = None

    def _close(self) -> None:
        self.state = BreakerState.CLOSED
        self.probe_started = None
        self._outcomes.clear()
        self._failures = 0
