"""Making a Celery app a ratchet app: :mod:`~celery_ratchet.celery.app.install` (the
composition root of this layer: sender, control, events, consumer step, settings, signals),
``RatchetTask`` and ``celery_ratchet.Celery``, the hook that installs every app whose task
class is a ``RatchetTask`` before its first use, and Celery's ``celery.commands`` entry point
(``-P ratchet``, ``celery -A app ratchet``). No other room imports this one."""
