"""celery_ratchet: Celery tasks run out of your SQL database, with no message broker.

    from celery_ratchet import Celery

    app = Celery("shop")
    app.conf.ratchet_url = "postgresql://localhost/shop"

Names are imported lazily, so the pure and store layers never pull in Celery.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from celery_ratchet import errors as _errors

__version__ = "0.1.0"

_EXPORTS = {
    "Celery": "celery_ratchet.celery.app.application",
    "RatchetTask": "celery_ratchet.celery.app.task",
    "install": "celery_ratchet.celery.app.install",
    "dlq": "celery_ratchet.celery.state",
    "bulk": "celery_ratchet.celery.send.sender",
    "transaction": "celery_ratchet.celery.send.transactions",
    "job_logger": "celery_ratchet.celery.schedules.housekeeping",
    "batch": "celery_ratchet.celery.canvas.batch_builder",
    "workflow": "celery_ratchet.celery.canvas.workflows",
    "predicate": "celery_ratchet.celery.canvas.workflows",
    "recurring": "celery_ratchet.celery.schedules.recurring",
    "schedule_recurring": "celery_ratchet.celery.schedules.recurring",
    "cancel_recurring": "celery_ratchet.celery.schedules.recurring",
    "pause_recurring": "celery_ratchet.celery.schedules.recurring",
    "resume_recurring": "celery_ratchet.celery.schedules.recurring",
    "crontab_to_quartz": "celery_ratchet.celery.schedules.recurring",
    "dashboard": "celery_ratchet.celery.control.dashboard",
    "metrics_collector": "celery_ratchet.celery.control.dashboard",
    "MisfirePolicy": "celery_ratchet.domain.schedule",
    "circuit_breaker": "celery_ratchet.celery.worker.breaker",
    "do_not_retry": "celery_ratchet.domain.retry",
    "DoNotRetry": "celery_ratchet.domain.retry",
    "RetryPolicy": "celery_ratchet.domain.retry",
    "Priority": "celery_ratchet.domain.priority",
    "CronExpression": "celery_ratchet.domain.cron",
    "CronError": "celery_ratchet.domain.cron",
}
# Every exception of celery_ratchet.errors, so that ``except celery_ratchet.StoreBusy`` works for
# each one the documentation names. errors.py imports nothing, so reading it here stays cheap.
_EXPORTS.update(
    (name, _errors.__name__)
    for name, value in vars(_errors).items()
    if isinstance(value, type) and issubclass(value, _errors.RatchetError)
)

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'celery_ratchet' has no attribute {name!r}") from None
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
