"""The Celery layer: the only package that imports Celery, kombu and billiard.

Its rooms, each named for what it does:

- ``app``: making a Celery app a ratchet app (``install``, the composition root;
  ``RatchetTask``, ``celery_ratchet.Celery``, the first-use hook, the ``celery ratchet``
  command and the ``-P ratchet`` pool aliases).
- ``send``: the send path, from ``apply_async`` to a written job row, and Celery's messages
  as job rows and back.
- ``canvas``: chords and batches completed by the database, ``batch()``, streamed batches and
  ``workflow()``.
- ``execution``: the path of a claimed job through Celery and of its outcome back: dispatch,
  the job as a message, the request hooks, the pools, fencing, the outcome to the settler
  (its ``__init__`` narrates the path, module by module).
- ``worker``: the worker side around it: the consumer bootstep that wires the runtime into
  Celery's worker, retries, breakers, the transport and the worker's remote-control answers.
- ``results``: the result backend on the job rows.
- ``control``: remote control and revokes from the client, Celery events, Flower, the
  dashboard and dead-letter alerts.
- ``schedules``: recurring jobs and housekeeping.
- ``django``: Django's database as the store, and jobs in Django's transactions.
- ``broker_import``: moving a broker's messages into the store.

Shared by every room: :mod:`~celery_ratchet.celery.state` (the per-app ratchet state: the
app's job store as the store's ports, :mod:`celery_ratchet.store.celery_ports`) and
:mod:`~celery_ratchet.celery.compat` (every Celery, kombu and billiard private touched, one
name each).
"""
