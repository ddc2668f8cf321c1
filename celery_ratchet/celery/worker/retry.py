"""Ratchet's retry decision inside Celery: failures become ``self.retry`` calls.

A task takes part when it (or its call) names a ``backoff`` or ``max_retries`` ratchet
option, or a ``ratchet_retry_policy`` is set on the task or the app. Its ``run`` is wrapped
so that an exception goes through :func:`celery_ratchet.domain.retry.decide`; a retry is
Celery's own (state RETRY, ``task_retry`` signal, ``self.request.retries`` + 1, the same row
rescheduled), and the last failure is an ordinary failure: the job is FAILED, which is the
dead-letter queue. Celery's ``autoretry_for`` and explicit ``self.retry`` keep working as
documented; a do-not-retry exception is never retried by any of them.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

from celery import Celery, signals
from celery.exceptions import Ignore, Reject, Retry
from celery.utils.imports import symbol_by_name

from celery_ratchet.celery.execution.aio import wrap_async
from celery_ratchet.celery.send.options import HEADER, task_defaults
from celery_ratchet.domain.retry import (
    DEFAULT_POLICY,
    Backoff,
    RetryDecision,
    RetryPolicy,
    decide,
    is_do_not_retry,
)
from celery_ratchet.errors import ConfigurationError

_WRAPPED = "_ratchet_retry_wrapped"
#: Celery has no "unlimited" for ``retry(max_retries=)``; this is as good.
_UNLIMITED = sys.maxsize


@dataclass(frozen=True)
class RetryPlan:
    policy: RetryPolicy
    backoff: Backoff
    backoff_param: float
    max_retries: int | None


def load_policy(value: Any, where: str) -> RetryPolicy | None:
    """A RetryPolicy from an instance, a class, or an import path ``pkg.mod:Name``."""
    if value is None or value == "":
        return None
    try:
        found = symbol_by_name(value) if isinstance(value, str) else value
        policy = found() if isinstance(found, type) else found
    except Exception as exc:
        raise ConfigurationError(f"{where} = {value!r} cannot be loaded: {exc}") from exc
    if not (callable(getattr(policy, "should_retry", None)) and hasattr(policy, "get_delay")):
        raise ConfigurationError(
            f"{where} = {value!r} is not a RetryPolicy (needs should_retry and get_delay)"
        )
    return policy


def retry_plan(app: Celery, task: Any, request: Any) -> RetryPlan | None:
    """How the job now failing retries, or None when ratchet retries are not asked for."""
    given = getattr(request, HEADER, None)
    if not isinstance(given, dict):
        headers = getattr(request, "headers", None)
        given = (headers or {}).get(HEADER) if isinstance(headers, dict) else None
    options = {**task_defaults(task), **(given or {})}
    policy = load_policy(
        getattr(task, "ratchet_retry_policy", None), f"{task.name}.ratchet_retry_policy"
    )
    if policy is None:
        configured = os.environ.get("RATCHET_RETRY_POLICY") or app.conf.get("ratchet_retry_policy")
        policy = load_policy(configured, "ratchet_retry_policy")
    if policy is None and "backoff" not in options and "max_retries" not in options:
        return None
    max_retries = options.get("max_retries", task.max_retries)
    return RetryPlan(
        policy=policy or DEFAULT_POLICY,
        backoff=Backoff.parse(options.get("backoff", Backoff.EXPONENTIAL)),
        backoff_param=float(options.get("backoff_param", 1.0)),
        max_retries=max_retries,
    )


def decision_for(app: Celery, task: Any, request: Any, exc: BaseException) -> RetryDecision | None:
    plan = retry_plan(app, task, request)
    if plan is None:
        return None
    return decide(
        exc,
        attempt=int(getattr(request, "retries", 0) or 0) + 1,
        max_retries=plan.max_retries,
        policy=plan.policy,
        backoff=plan.backoff,
        backoff_param=plan.backoff_param,
    )


def wrap_run(app: Celery, task: Any) -> None:
    """Route the task's failures through the retry decision (idempotent)."""
    if getattr(task, _WRAPPED, False):
        return
    run = task.run

    def retried(exc: Exception) -> BaseException:
        """What to raise for ``exc``: Celery's Retry when the policy retries, else ``exc``."""
        if isinstance(exc, (Retry, Ignore, Reject)):
            return exc
        decision = decision_for(app, task, task.request, exc)
        if decision is None or not decision.retry:
            return exc
        limit = _UNLIMITED if decision.max_retries is None else decision.max_retries
        return task.retry(exc=exc, countdown=decision.delay, max_retries=limit)  # type: ignore[no-any-return,unused-ignore]

    def reraise(exc: Exception) -> NoReturn:
        raised = retried(exc)
        if raised is exc:
            raise exc
        raise raised from exc

    if inspect.iscoroutinefunction(run):
        # An async task fails when its coroutine raises, not when run() returns it.
        @functools.wraps(run)
        async def run_async_with_retries(*args: Any, **kwargs: Any) -> Any:
            try:
                return await run(*args, **kwargs)
            except Exception as exc:
                reraise(exc)

        task.run = run_async_with_retries
    else:

        @functools.wraps(run)
        def run_with_retries(*args: Any, **kwargs: Any) -> Any:
            try:
                return run(*args, **kwargs)
            except Exception as exc:
                reraise(exc)

        task.run = run_with_retries
    setattr(task, _WRAPPED, True)


def install_retries(app: Celery) -> None:
    for task in list(app.tasks.values()):
        if not task.name.startswith("celery."):
            wrap_run(app, task)
            wrap_async(task)


def refuse_do_not_retry(exc: BaseException | None) -> None:
    """``self.retry`` of a do-not-retry failure raises the failure itself instead."""
    if exc is None:
        exc = sys.exc_info()[1]
    if exc is not None and not isinstance(exc, Retry) and is_do_not_retry(exc):
        raise exc


def connect(app: Celery) -> None:
    """Wrap tasks in each pool process too (forked before the consumer starts)."""

    def on_process_init(**_: Any) -> None:
        install_retries(app)

    signals.worker_process_init.connect(on_process_init, weak=False)
    signals.worker_init.connect(lambda **_: install_retries(app), weak=False)
