"""The task base class that makes an app a ratchet app: ``Celery(task_cls=RatchetTask)``."""

from __future__ import annotations

from celery import Celery, Task

from celery_ratchet.celery.app import install


class RatchetTask(Task):
    """A Celery task whose sends land in the job store and whose runs are claimed from it.

    Binding any task of this class to an app installs ratchet on that app. An app that only
    sends by name (``send_task``) and defines no task calls ``celery_ratchet.install(app)``.
    """

    Request = "celery_ratchet.celery.request:RatchetRequest"

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        install(app)
        super().on_bound(app)
