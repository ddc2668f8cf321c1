"""The path of a claimed job through Celery's execution, and of its outcome back.

Read in this order, the modules are the path a job takes once the runtime's
:class:`~celery_ratchet.runtime.claiming.Claimer` has claimed it (``runtime/`` knows nothing
of Celery; this package is where its jobs meet Celery):

1. :mod:`.dispatch`: the Claimer hands each job of its batch, one by one, to
   :class:`~.dispatch.Dispatcher` (``Dispatcher.__call__``), in the claim loop's thread. A row
   stored with a serializer that can run code, unless ``ratchet_allow_pickle``, fails unrun
   (``Dispatcher._refused``). A task this worker does not know is handed over
   (``Dispatcher._unknown``, raising :class:`~celery_ratchet.runtime.base.Declined`): to a
   live worker that said it has the task (``Dispatcher._knowing``), else back to the queue for
   a while (a rolling deploy), then failed as ``NotRegistered``. Any other job becomes a
   message and goes to the task's Celery strategy, as a broker's delivery would.
2. :mod:`.job_message`: :class:`~.job_message.JobMessage`, the claimed row as a kombu message
   (its body within ``ratchet_max_payload_kb`` once decompressed, the claim token and fence
   stamp in its headers, its JSON decoded without kombu's hook where that gives the same:
   ``decodes_plainly``). It owns the execution's end: :meth:`~.job_message.JobMessage.end`
   reports once, later reports are ignored. :func:`~.job_message.retry_of` makes the row's
   next try.
3. Celery's strategy (``celery.worker.strategy.default``), unchanged: it builds the task's
   Request and gives the ``Task name[id] received`` log line, the expiry and revocation
   checks, the ``task_received`` signal, the ``task-received`` event, rate limits
   (``rate_limit``), and the reserved list that ``inspect reserved`` reads; then Celery's
   consumer calls ``Request.execute_using_pool``. Its ETA timer is not used: the store held
   the job until it was due (``RatchetRequest.eta`` is None).
4. :mod:`.request`: :class:`~.request.RatchetRequest`, Celery's ``Request`` with hooks.
   Celery's Request gives the active list (``inspect active``, ``query_task``),
   ``revoke(terminate=True)`` (``Request.terminate``), soft and hard time limits handed to the
   pool, the ``task-started``, ``task-succeeded``, ``task-failed`` and ``task-retried``
   events, and Celery's own ``on_success``/``on_failure``/``on_timeout`` decisions (retry,
   reject, ignore, revoke, a lost child). The hooks turn each decision into
   ``JobMessage.end``: the first outcome of an execution wins.
5. The pool, from ``celery worker -P``: Celery's ``threads`` and ``solo`` as they are;
   ``-P ratchet``, Celery's prefork (child processes, soft and hard time limits a child
   cannot ignore, ``worker_max_tasks_per_child``/``worker_max_memory_per_child`` recycling)
   with ratchet's stop in :mod:`.prefork`; ``-P ratchet-async``, ``async def`` tasks as
   coroutines on one event loop (:mod:`.asyncpool`, Celery's synchronous trace around a
   coroutine in :mod:`.aio`). On every pool, :func:`.stopping.guard` wraps what the pool runs
   in :func:`.stopping.guarded`: a job still waiting for its turn when the worker began to
   stop is handed back, not started. :mod:`.capacity` says how many jobs the pool runs and
   the Claimer claims ahead, from ``-c`` and the prefetch multiplier.
6. :mod:`.fencing`: in the process that runs the job, the task's tracer (``Task.__trace__``,
   built by Celery's consumer and, in each prefork child, by Celery's process initializer) is
   wrapped (:func:`.fencing.fence_tracers`): before the task starts,
   :func:`.fencing.check_claim` asks the node's fence, else the database, whether this
   execution still holds the claim. A claim gone or unreadable means the job is not started.
7. Celery's trace (``celery.app.trace.build_tracer``), unchanged: ``task_prerun``, the task,
   the result stored through the result backend, Celery's retries, callbacks and chains,
   ``task_success``/``task_failure``, ``task_postrun``.
8. :mod:`.outcomes`: back in the worker's main process, Celery's pool calls the Request's
   hooks, whose ``JobMessage.end`` calls :func:`.outcomes.report_end`: the runtime's
   :class:`~celery_ratchet.runtime.outcomes.Settler` writes the row's end (settle), or only
   frees the slot when the row moved on already (release), and the task's circuit breaker
   counts it (record_outcome).

An execution's outcome reaches its row by one of two channels today:

- the settler, in the worker's own process: every end reported by step 8, and, on the pools
  that run tasks in that process (threads, solo, ``ratchet-async``), a plain success's
  result too: the result backend hands it to the settler
  (``RatchetBackend._handed_to_settler``), which writes it with its next batch;
- the result backend's own write: in a ``-P ratchet`` child process, which has no settler,
  and for what the settler does not take (a failure's state, a chord member, a result not
  surely storable), the backend writes the row itself when Celery's trace stores the result
  (a compare-and-swap on the claim token). After a success stored so, the Request's report
  only frees the slot (release); any other end is settled by step 8 as well, a write that
  changes nothing once the row is no longer running under that claim.

What stays in :mod:`celery_ratchet.celery.worker`: the ``JobConsumer`` bootstep that wires
this path into Celery's consumer (the runtime, the dispatcher, the guard, the tracers),
housekeeping, recurring jobs, task-option checks, remote control, ``inspect scheduled``,
the transport standing in for a broker connection, retries, circuit breakers and the pool
choice. Celery's consumer is kept because ``celery worker`` then starts, stops, sends events
and runs remote-control commands with Celery's own handlers as stock does; its ``Tasks``
step builds each task's strategy and tracer, which the path above uses as they are.
"""
