"""The worker side: the consumer bootstep that feeds Celery's worker from the store
(:mod:`~celery_ratchet.celery.worker.consumer`), the request hooks that settle each execution,
the ``ratchet`` and ``ratchet-async`` pools and ``async def`` tasks, claim capacity, the
fencing check before a job runs, ratchet's retries and circuit breakers, the transport that
stands in for a broker connection, and the worker's answers to remote control and
``inspect scheduled``."""
