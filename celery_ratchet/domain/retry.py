"""What happens after a job fails: retry (and when) or the dead-letter queue. Pure.

The decision path follows the Ratchet seeds:

1. An exception class marked do-not-retry (:func:`do_not_retry`, or a subclass of
   :class:`DoNotRetry`; any class in its hierarchy counts) goes straight to the DLQ.
2. ``RetryPolicy.should_retry(attempt, exc)`` (default: always) may refuse.
3. The job is retried while ``attempt <= max_retries``; ``attempt`` counts executions that
   failed, so ``max_retries=3`` means at most four executions.
4. The delay is ``RetryPolicy.get_delay(attempt)``, or when that is zero the job's backoff:
   ``none`` (0), ``fixed`` (``param``), ``exponential`` (``param * 2**(attempt-1)``, capped
   at 24 hours).
5. Otherwise the job is FAILED, which is the dead-letter queue.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, TypeVar

MAX_BACKOFF_SECONDS = 24 * 3600.0
_MARK = "__ratchet_do_not_retry__"

E = TypeVar("E", bound=type[BaseException])


class DoNotRetry(Exception):
    """Raise a subclass of this (or mark a class with :func:`do_not_retry`) for failures that
    retrying cannot fix: the job goes straight to the dead-letter queue."""


def do_not_retry(cls: E) -> E:
    """Class decorator: failures of this exception class (and its subclasses) are never
    retried, neither by ratchet's retry policy nor by ``self.retry``/``autoretry_for``."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise TypeError(f"@do_not_retry marks exception classes, not {cls!r}")
    setattr(cls, _MARK, True)
    return cls


def is_do_not_retry(exc: BaseException | type[BaseException]) -> bool:
    kind = exc if isinstance(exc, type) else type(exc)
    return any(klass is DoNotRetry or klass.__dict__.get(_MARK, False) for klass in kind.__mro__)


class Backoff(str, enum.Enum):
    NONE = "none"
    FIXED = "fixed"
    EXPONENTIAL = "exponential"

    @classmethod
    def parse(cls, value: Any) -> Backoff:
        if isinstance(value, Backoff):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(
                f"backoff must be one of none, fixed, exponential; got {value!r}"
            ) from None


def backoff_delay(backoff: Backoff, param_seconds: float, attempt: int) -> float:
    """Seconds to wait before the retry that follows failed execution number ``attempt``."""
    if attempt < 1:
        raise ValueError(f"attempt counts failed executions from 1, got {attempt}")
    if backoff is Backoff.NONE:
        return 0.0
    if backoff is Backoff.FIXED:
        return min(float(param_seconds), MAX_BACKOFF_SECONDS)
    exponent = min(attempt - 1, 64)  # 2**64 seconds is past any cap; avoid huge floats
    return float(min(param_seconds * 2.0**exponent, MAX_BACKOFF_SECONDS))


class RetryPolicy:
    """The seeds' RetryPolicy SPI. Subclass and set it per app (``ratchet_retry_policy``)
    or per task (``ratchet_retry_policy`` attribute); an instance or an import path."""

    def should_retry(self, attempt: int, exc: BaseException) -> bool:
        return True

    def get_delay(self, attempt: int) -> float:
        """Seconds before the next try; 0 defers to the job's backoff setting."""
        return 0.0


DEFAULT_POLICY = RetryPolicy()


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay: float = 0.0
    reason: str = ""
    #: The limit the decision was made against (None: no limit).
    max_retries: int | None = None


def decide(
    exc: BaseException,
    *,
    attempt: int,
    max_retries: int | None,
    policy: RetryPolicy = DEFAULT_POLICY,
    backoff: Backoff = Backoff.EXPONENTIAL,
    backoff_param: float = 1.0,
) -> RetryDecision:
    """Retry failed execution number ``attempt`` (from 1), or send it to the DLQ.
    ``max_retries=None`` retries without limit."""
    if is_do_not_retry(exc):
        return RetryDecision(False, reason=f"{type(exc).__name__} is marked do-not-retry")
    if not policy.should_retry(attempt, exc):
        return RetryDecision(False, reason=f"{type(policy).__name__} refused a retry")
    if max_retries is not None and attempt > max_retries:
        return RetryDecision(False, reason=f"retries exhausted ({max_retries})")
    delay = float(policy.get_delay(attempt) or 0.0)
    if delay <= 0:
        delay = backoff_delay(backoff, backoff_param, attempt)
    return RetryDecision(True, min(delay, MAX_BACKOFF_SECONDS), max_retries=max_retries)
