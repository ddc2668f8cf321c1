"""The task base class that makes an app a ratchet app: ``Celery(task_cls=RatchetTask)``."""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from celery_ratchet.celery.app import install
from celery_ratchet.celery.retry import refuse_do_not_retry
from celery_ratchet.celery.sender import follow_in_open_batch


class RatchetTask(Task):
    """A Celery task whose sends land in the job store and whose runs are claimed from it.

    Binding any task of this class to an app installs ratchet on that app. An app that only
    sends by name (``send_task``) and defines no task calls ``celery_ratchet.install(app)``.
    """

    Request = "celery_ratchet.celery.request:RatchetRequest"

    #: Ratchet options (see ``celery_ratchet.celery.options``); ``apply_async(ratchet=...)``
    #: overrides them per call.
    resource: str | None = None
    backoff: str | None = None
    backoff_param: float | None = None
    timeout: float | None = None
    #: A RetryPolicy (instance, class or import path) for this task's failures.
    ratchet_retry_policy: Any = None
    #: ``"service"`` or ``{"name": ..., "failure_rate": ..., "window": ..., "open_seconds": ...}``.
    circuit_breaker: Any = None

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's retry, except that a do-not-retry failure is raised as it is."""
        refuse_do_not_retry(exc)
        return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> Any:
        """Celery's, and followed by the batch being written, if any: a group member whose
        business key an active job holds gets that job's id once the group is stored."""
        result = super().AsyncResult(task_id, **kwargs)
        follow_in_open_batch(result)
        return result

    @property
    def ratchet_log(self) -> Any:
        """This job's log (lines stored with the job): ``self.ratchet_log.info(...)``."""
        from celery_ratchet.celery.housekeeping import JobLogger

        return JobLogger(self)

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        install(app)
        super().on_bound(app)
