"""The task base class that makes an app a ratchet app: ``Celery(task_cls=RatchetTask)``."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from typing import Any

from celery import Celery, Task

from celery_ratchet.celery.app.first_use import install_if_ratchet_app, watch_new_apps
from celery_ratchet.celery.compat import django_task_method
from celery_ratchet.celery.execution.aio import wrap_async
from celery_ratchet.celery.send.sender import follow_in_open_batch
from celery_ratchet.celery.worker.retry import refuse_do_not_retry

# Installed packages watch every app from Celery's import on (celery_ratchet.celery.app.autoload);
# a process that runs celery_ratchet from a source tree watches from here.
watch_new_apps()


class RatchetTask(Task):
    """A Celery task whose sends land in the job store and whose runs are claimed from it.

    An app whose task class this is (or a subclass) is a ratchet app from its first send,
    result read or control call on (``first_use``), and binding a task to such an app
    installs ratchet there at once. Binding a task of this class to an app of another task
    class leaves that app as it is: Celery makes each shared task anew, with the base it was
    declared with, on every app of the process as that app is finalized.
    """

    Request = "celery_ratchet.celery.execution.request:RatchetRequest"

    #: Marks this class and its subclasses as the base of a ratchet app (``is_ratchet_app``).
    ratchet_installs_app = True

    #: Ratchet options (see ``celery_ratchet.celery.send.options``); ``apply_async(ratchet=...)``
    #: overrides them per call.
    resource: str | None = None
    backoff: str | None = None
    backoff_param: float | None = None
    timeout: float | None = None
    #: A RetryPolicy (instance, class or import path) for this task's failures.
    ratchet_retry_policy: Any = None
    #: ``"service"`` or ``{"name": ..., "failure_rate": ..., "window": ..., "open_seconds": ...}``.
    circuit_breaker: Any = None

    def __init__(self) -> None:
        # An ``async def`` task returns its outcome to Celery's tracer, on every pool and in
        # an eager apply(), not a coroutine.
        wrap_async(self)

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

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``delay()`` once the current Django transaction commits; nothing if it rolls back.

        Celery's Django task method, kept for ratchet tasks (Celery adds it only to apps
        without a task class of their own). Needs Django, configured."""
        django_task_method("delay_on_commit")(self, *args, **kwargs)

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``apply_async()`` once the current Django transaction commits (see
        :meth:`delay_on_commit`)."""
        django_task_method("apply_async_on_commit")(self, *args, **kwargs)

    async def aapply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """``apply_async`` for async code: the job's insert runs in a thread, so the event
        loop goes on meanwhile. Sent from a running task, the job is its child (as
        ``apply_async`` makes it), though the send leaves the task's context."""
        parent = self.app.current_worker_task
        if parent is not None and parent.request.id:
            options.setdefault("parent_id", parent.request.id)
            options.setdefault("root_id", parent.request.root_id or parent.request.id)
        send = functools.partial(self.apply_async, args, kwargs, **options)
        # In the caller's context: inside celery_ratchet.transaction() the job is written on
        # the caller's connection (and exists only if that commits), as apply_async does.
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(None, context.run, send)

    async def adelay(self, *args: Any, **kwargs: Any) -> Any:
        """``delay`` for async code: ``await task.adelay(1, 2)``."""
        return await self.aapply_async(args, kwargs)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> Any:
        """Celery's, and followed by the batch being written, if any: a group member whose
        business key an active job holds gets that job's id once the group is stored."""
        result = super().AsyncResult(task_id, **kwargs)
        follow_in_open_batch(result)
        return result

    @property
    def ratchet_log(self) -> Any:
        """This job's log (lines stored with the job): ``self.ratchet_log.info(...)``."""
        from celery_ratchet.celery.schedules.housekeeping import JobLogger

        return JobLogger(self)

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        install_if_ratchet_app(app)
        super().on_bound(app)
