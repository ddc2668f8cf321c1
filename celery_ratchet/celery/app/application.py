"""``celery_ratchet.Celery``: a Celery app that is a ratchet app from the moment it exists.

It is ``celery.Celery`` with ``RatchetTask`` as its default task class, installing ratchet in
its constructor, before any configuration is read. ``Celery("shop",
task_cls="celery_ratchet:RatchetTask")`` gets the same from ``first_use``, which looks at
every app of the process as it is made; this class does not depend on that (a process
running celery_ratchet from a source tree, without its entry points, still gets a ratchet app
from its first call).
"""

from __future__ import annotations

from typing import Any

import celery

from celery_ratchet.celery.app.install import install

TASK_CLS = "celery_ratchet:RatchetTask"


class Celery(celery.Celery):
    """``celery.Celery`` with ``RatchetTask`` as its task base class and ratchet installed.

    Takes the same arguments; ``task_cls`` may name a subclass of ``RatchetTask``.
    """

    task_cls = TASK_CLS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        install(self)
