"""The send path: every ``.delay``, ``apply_async``, ``send_task``, retry and canvas send
reaches ``app.amqp.send_task_message`` (:mod:`~celery_ratchet.celery.send.amqp`) and is
written as a job row (:mod:`~celery_ratchet.celery.send.sender`), in the caller's transaction
when there is one. Also Celery's task messages as job rows
(:mod:`~celery_ratchet.celery.send.message`), per-job options, groups sent from one message,
and a chain's next step handed to this worker. Imports nothing of the worker side."""
