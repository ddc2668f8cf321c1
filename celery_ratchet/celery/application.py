"""``celery_ratchet.Celery``: a Celery app that is a ratchet app from the moment it exists.

``Celery("shop", task_cls="celery_ratchet:RatchetTask")`` becomes a ratchet app only when
something evaluates its task class (a task is bound, or the ``celery`` program loads it):
Celery offers no hook that runs when such an app is configured, and nothing imports
celery_ratchet before then. A process that only sends by name, reads results or pings workers
before that moment would use the stock broker and result backend. This class installs ratchet
in its constructor instead, before any configuration is read, so every entry point sees a
ratchet app.
"""

from __future__ import annotations

from typing import Any

import celery

from celery_ratchet.celery.install import install

TASK_CLS = "celery_ratchet:RatchetTask"


class Celery(celery.Celery):
    """``celery.Celery`` with ``RatchetTask`` as its task base class and ratchet installed.

    Takes the same arguments; ``task_cls`` may name a subclass of ``RatchetTask``.
    """

    task_cls = TASK_CLS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        install(self)
