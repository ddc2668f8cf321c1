"""``celery worker -P ratchet``: Celery's prefork pool, in a worker that runs from the store.

Execution stays Celery's (child processes, soft and hard time limits); what makes the worker a
ratchet worker is the ``JobConsumer`` step every ratchet app registers. ``-P threads`` and
``-P solo`` work on a ratchet app too.
"""

from __future__ import annotations

from celery.concurrency.prefork import TaskPool


class RatchetPool(TaskPool):
    pass
