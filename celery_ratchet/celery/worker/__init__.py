"""The worker side around the execution path: the consumer bootstep that wires the runtime
and :mod:`celery_ratchet.celery.execution` into Celery's worker
(:mod:`~celery_ratchet.celery.worker.consumer`: housekeeping, recurring jobs, task-option
checks, revokes of started jobs), ratchet's retries and circuit breakers, the pool choice, the
transport that stands in for a broker connection, and the worker's answers to remote control
and ``inspect scheduled``. The path of a claimed job to Celery's tracer and back is
:mod:`celery_ratchet.celery.execution`'s."""
