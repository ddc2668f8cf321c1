"""The job store: every read and write of job rows, as named operations.

Every completion is a compare-and-swap on (job id, claim token, status RUNNING): a worker whose
claim was taken away (orphan recovery, a retry that rescheduled the row) can never overwrite it.

:class:`JobStore` is a facade: one :class:`~celery_ratchet.store.database.Database`, its
:class:`~celery_ratchet.store.dialect.Dialect`, and one part per concern, each preparing its
own statements; every operation is its part's (``delegated``).
"""

from __future__ import annotations

from functools import cached_property

from sqlalchemy.engine import Engine

from celery_ratchet.domain.priority import DEFAULT_BOOST_MINUTES
from celery_ratchet.store.admin import Admin
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.celery_ports import CeleryStore
from celery_ratchet.store.claims import Claims
from celery_ratchet.store.control import ControlStore, control_store
from celery_ratchet.store.database import Database, Reachability
from celery_ratchet.store.delegation import delegated
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import EngineOptions
from celery_ratchet.store.enqueue import Enqueue
from celery_ratchet.store.inspection import Inspection
from celery_ratchet.store.metrics_reads import MetricsReads
from celery_ratchet.store.nodes import Nodes
from celery_ratchet.store.ports import DeadLetterStore, ScheduleStore, WorkerStore
from celery_ratchet.store.queue_pauses import QueuePauses
from celery_ratchet.store.read_ports import DashboardStore
from celery_ratchet.store.recurring import Masters
from celery_ratchet.store.results import Results
from celery_ratchet.store.revocation import Revocations
from celery_ratchet.store.row_writer import RowWriter
from celery_ratchet.store.settle import Settle
from celery_ratchet.store.step_handoff import StepHandoff
from celery_ratchet.store.task_handoff import TaskHandoff


class JobStore:
    """Job rows in one database. Thread-safe; one instance per URL per process is enough."""

    def __init__(
        self,
        url: str,
        *,
        create_schema: bool = True,
        engine: Engine | None = None,
        priority_boost_minutes: float = DEFAULT_BOOST_MINUTES,
        notify: bool = False,
        engine_options: EngineOptions | None = None,
        dlq_alert_task: str | None = None,
    ):
        #: The database: connections, outages and retries, announcements, schema checks.
        self.db = Database(
            url,
            create_schema=create_schema,
            engine=engine,
            notify=notify,
            engine_options=engine_options,
        )
        #: What this database does differently (store/dialect.py).
        self.dialect: Dialect = self.db.dialect
        self.url = url
        self.display_url = self.db.display_url
        self.family = self.db.family
        #: The task sent dead-letter alerts: with one, each job failing for good is counted
        #: into its task name's alert window, in the transaction that fails it.
        self.dlq_alert_task = dlq_alert_task
        #: Aging: a waiting job gains one priority level per this many minutes (0: never).
        self.priority_boost_minutes = max(float(priority_boost_minutes), 0.0)
        db, dialect = self.db, self.dialect
        self.rows = RowWriter(db, dialect)
        self.enqueuer = Enqueue(db, dialect, self.rows)
        self.masters = Masters(db, dialect, self.rows, self.enqueuer)
        self.settler = Settle(db, dialect, dlq_alert_task=dlq_alert_task)
        self.claims = Claims(
            db, dialect, self.settler, priority_boost_minutes=self.priority_boost_minutes
        )
        self.nodes = Nodes(db, dialect, self.settler)
        self.handoff = StepHandoff(db, dialect, self.claims, self.rows)
        self.task_handoff = TaskHandoff(db)
        self.results = Results(db, dialect)
        self.revoker = Revocations(db, dialect)
        self.admin = Admin(db, dialect, self.rows)
        self.pauses = QueuePauses(db)

    @property
    def engine(self) -> Engine:
        """The database's engine (one pool of connections)."""
        return self.db.engine

    @property
    def notify(self) -> bool:
        """PostgreSQL: inserts notify listening workers (LISTEN/NOTIFY wake-ups)."""
        return self.db.notify

    @property
    def reachability(self) -> Reachability:
        """Whether the database answers, as this process last found it."""
        return self.db.reachability

    # The parts read and written beside the job rows, each made on first use: the layers
    # above reach them through the store (store/read_ports.py), never by making one.

    @cached_property
    def inspection(self) -> Inspection:
        """Read-only views of this database (the dashboard's pages)."""
        return Inspection(self)

    @cached_property
    def metrics_reads(self) -> MetricsReads:
        """What a Prometheus scrape reads (``GET /metrics``)."""
        return MetricsReads(self)

    @cached_property
    def batches(self) -> BatchStore:
        """Batches, chain steps and workflow conditions in this database."""
        return BatchStore(self)

    @property
    def control(self) -> ControlStore:
        """The remote control rows (``celery inspect`` / ``celery control`` without a
        broker): the same one the runtime reaches by ``control_store(store)``."""
        return control_store(self)

    # Database (database.py)
    stop_notifying = delegated("db", Database.stop_notifying)
    send_probe = delegated("db", Database.send_probe)
    ensure_schema = delegated("db", Database.ensure_schema)
    create_missing_tables = delegated("db", Database.create_missing_tables)
    schema_differences = delegated("db", Database.schema_differences)
    index_shapes = delegated("db", Database.index_shapes)
    announce = delegated("db", Database.announce)

    # Enqueue (enqueue.py)
    enqueue = delegated("enqueuer", Enqueue.enqueue)
    enqueue_many = delegated("enqueuer", Enqueue.enqueue_many)
    import_jobs = delegated("enqueuer", Enqueue.import_jobs)
    stored_contents = delegated("enqueuer", Enqueue.stored_contents)
    enqueue_with = delegated("enqueuer", Enqueue.enqueue_with)
    wait_in_place = delegated("enqueuer", Enqueue.wait_in_place)
    enqueue_within = delegated("enqueuer", Enqueue.enqueue_within)
    replace_running = delegated("enqueuer", Enqueue.replace_running)

    # Masters (recurring.py)
    upsert_master = delegated("masters", Masters.upsert_master)
    fire_master = delegated("masters", Masters.fire_master)
    fire_masters = delegated("masters", Masters.fire_masters)
    set_master_status = delegated("masters", Masters.set_master_status)
    run_master_now = delegated("masters", Masters.run_master_now)
    list_masters = delegated("masters", Masters.list_masters)

    # Claims (claims.py)
    claim = delegated("claims", Claims.claim)
    claim_for_resource = delegated("claims", Claims.claim_for_resource)
    running_claims = delegated("claims", Claims.running_claims)
    next_due_in = delegated("claims", Claims.next_due_in)

    # Settle (settle.py)
    settle = delegated("settler", Settle.settle)
    defer = delegated("settler", Settle.defer)
    store_outcome = delegated("settler", Settle.store_outcome)
    holds = delegated("settler", Settle.holds)
    note_retry = delegated("settler", Settle.note_retry)
    store_progress = delegated("settler", Settle.store_progress)

    # Nodes (nodes.py)
    register_node = delegated("nodes", Nodes.register_node)
    heartbeat = delegated("nodes", Nodes.heartbeat)
    database_time = delegated("nodes", Nodes.database_time)
    set_node_queues = delegated("nodes", Nodes.set_node_queues)
    remove_node = delegated("nodes", Nodes.remove_node)
    live_node_queues = delegated("nodes", Nodes.live_node_queues)
    node_heartbeats = delegated("nodes", Nodes.node_heartbeats)
    node_schedule_keys = delegated("nodes", Nodes.node_schedule_keys)
    recover_orphans = delegated("nodes", Nodes.recover_orphans)

    # StepHandoff (step_handoff.py)
    release_step_to = delegated("handoff", StepHandoff.release_step_to)

    # TaskHandoff (task_handoff.py)
    nodes_knowing = delegated("task_handoff", TaskHandoff.nodes_knowing)
    hand_to = delegated("task_handoff", TaskHandoff.hand_to)

    # Results (results.py)
    result = delegated("results", Results.result)
    forget = delegated("results", Results.forget)
    expire_results = delegated("results", Results.expire_results)
    save_group = delegated("results", Results.save_group)
    load_group = delegated("results", Results.load_group)
    delete_group = delegated("results", Results.delete_group)
    store_untracked_result = delegated("results", Results.store_untracked_result)

    # Revocations (revocation.py)
    revoke_pending = delegated("revoker", Revocations.revoke_pending)
    request_revoke = delegated("revoker", Revocations.request_revoke)
    revocations = delegated("revoker", Revocations.revocations)

    # Admin (admin.py)
    purge_pending = delegated("admin", Admin.purge_pending)
    retry_failed = delegated("admin", Admin.retry_failed)
    purge_failed = delegated("admin", Admin.purge_failed)
    archive_finished = delegated("admin", Admin.archive_finished)
    add_log = delegated("admin", Admin.add_log)
    job_log = delegated("admin", Admin.job_log)
    purge_logs = delegated("admin", Admin.purge_logs)
    list_jobs = delegated("admin", Admin.list_jobs)
    due_alert_windows = delegated("admin", Admin.due_alert_windows)
    close_alert_window = delegated("admin", Admin.close_alert_window)
    alert_states = delegated("admin", Admin.alert_states)
    scheduled_jobs = delegated("admin", Admin.scheduled_jobs)
    list_nodes = delegated("admin", Admin.list_nodes)
    queue_stats = delegated("admin", Admin.queue_stats)
    count_by_status = delegated("admin", Admin.count_by_status)

    # QueuePauses (queue_pauses.py)
    pause_queue = delegated("pauses", QueuePauses.pause)
    resume_queue = delegated("pauses", QueuePauses.resume)
    paused_queues = delegated("pauses", QueuePauses.paused)


def _implements_the_ports(
    store: JobStore,
) -> tuple[WorkerStore, DeadLetterStore, ScheduleStore, DashboardStore, CeleryStore]:
    """Never called: mypy checks here that a JobStore is every port the runtime, the
    dashboard and the Celery layer ask for."""
    return store, store, store, store, store
