"""Circuit breakers on tasks: ``@circuit_breaker("partner-api")`` or a task attribute.

The breaker state machine is :mod:`celery_ratchet.domain.breaker`; each worker keeps one
breaker per service name, fed by the outcomes of that service's jobs, and defers the jobs
of an open service (see ``WorkerRuntime``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery

from celery_ratchet.celery.compat import unproxied
from celery_ratchet.domain.breaker import BreakerConfig
from celery_ratchet.domain.job import ClaimedJob
from celery_ratchet.errors import ConfigurationError

ATTRIBUTE = "circuit_breaker"


def circuit_breaker(
    name: str,
    *,
    failure_rate: float = 0.5,
    window: int = 100,
    open_seconds: float = 30.0,
    minimum_calls: int | None = None,
) -> Callable[[Any], Any]:
    """Protect a task's service: put it above ``@app.task``.

    When at least ``failure_rate`` of the last ``window`` outcomes of jobs for ``name``
    failed, the breaker opens: those jobs wait ``open_seconds`` (they are not failed and
    lose no attempt), then one probe decides whether it closes again.
    """
    if not name:
        raise ValueError("a circuit breaker needs a service name")
    config = BreakerConfig(failure_rate, window, open_seconds, minimum_calls)

    def decorate(task: Any) -> Any:
        target = unproxied(task)
        setattr(target, ATTRIBUTE, (name, config))
        return task

    return decorate


def parse(value: Any, task_name: str) -> tuple[str, BreakerConfig] | None:
    """A task's ``circuit_breaker`` attribute: a service name, a mapping with ``name`` and
    the settings, or what the decorator stores."""
    if value is None or value is False:
        return None
    try:
        if isinstance(value, str):
            return value, BreakerConfig()
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], BreakerConfig):
            return str(value[0]), value[1]
        if isinstance(value, Mapping):
            settings = dict(value)
            return str(settings.pop("name")), BreakerConfig(**settings)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"task {task_name!r}: circuit_breaker = {value!r} is invalid ({exc})"
        ) from exc
    raise ConfigurationError(
        f"task {task_name!r}: circuit_breaker must be a service name or "
        f"{{'name': ..., 'failure_rate': ..., 'window': ..., 'open_seconds': ...}}, "
        f"got {value!r}"
    )


def lookup(app: Celery) -> Callable[[ClaimedJob], tuple[str, BreakerConfig] | None]:
    """The breaker of a claimed job's task, by task name (parsed once per task)."""
    cache: dict[str, tuple[str, BreakerConfig] | None] = {}

    def breaker_for(job: ClaimedJob) -> tuple[str, BreakerConfig] | None:
        if job.task_name not in cache:
            task = app.tasks.get(job.task_name)
            found = getattr(task, ATTRIBUTE, None) if task is not None else None
            cache[job.task_name] = parse(found, job.task_name)
        return cache[job.task_name]

    return breaker_for
