"""The job store in this process's memory: every port of ``store/ports.py`` with the
semantics :class:`~celery_ratchet.store.jobstore.JobStore` gives them on a database, for
unit tests of the runtime. One lock makes each operation atomic; time is read from the
``now`` it is given, so a test moves the clock instead of sleeping. The contract suite
(tests/contract) runs on it beside the databases.

What it does not hold: batches and chords, job logs, the archive, group results, the
schema, and what a database refuses (text longer than its column); those are JobStore's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import datetime

from celery_ratchet.domain.priority import DEFAULT_BOOST_MINUTES
from celery_ratchet.store.memory.control import ControlRows
from celery_ratchet.store.memory.dead_letters import DeadLetterRows
from celery_ratchet.store.memory.jobs import JobRows
from celery_ratchet.store.memory.masters import MasterRows
from celery_ratchet.store.memory.nodes import NodeRows
from celery_ratchet.store.memory.pauses import PauseRows
from celery_ratchet.store.memory.rows import Tables
from celery_ratchet.store.memory.state import MemoryState, utc_now


class MemoryStore:
    """Job rows in memory, thread-safe; ``now`` is its clock (UTC, aware). Its operations
    are those of its parts (jobs, nodes, masters, dead letters, remote control), which
    share one :class:`MemoryState`."""

    display_url = "memory://"

    def __init__(
        self,
        now: Callable[[], datetime] = utc_now,
        *,
        priority_boost_minutes: float = DEFAULT_BOOST_MINUTES,
        dlq_alert_task: str | None = None,
        shared: MemoryState | None = None,
    ) -> None:
        self.state = MemoryState(
            now,
            priority_boost_minutes=priority_boost_minutes,
            dlq_alert_task=dlq_alert_task,
            shared=shared,
        )
        self.now = self.state.now
        #: Every wake-up word announced, in order: what listening workers would have heard.
        self.announced = self.state.announced
        # ``store.control.control_store(store)`` returns this: the runtime reaches remote
        # control through it.
        self._control = self
        jobs = JobRows(self.state)
        self.enqueue = jobs.enqueue
        self.enqueue_many = jobs.enqueue_many
        self.claim = jobs.claim
        self.claim_for_resource = jobs.claim_for_resource
        self.defer = jobs.defer
        self.hand_to = jobs.hand_to
        self.settle = jobs.settle
        self.store_outcome = jobs.store_outcome
        self.replace_running = jobs.replace_running
        self.holds = jobs.holds
        self.next_due_in = jobs.next_due_in
        self.running_claims = jobs.running_claims
        self.result = jobs.result
        self.count_by_status = jobs.count_by_status
        self.request_revoke = jobs.request_revoke
        self.revoke_pending = jobs.revoke_pending
        self.revocations = jobs.revocations
        self.purge_pending = jobs.purge_pending
        nodes = NodeRows(self.state)
        self.register_node = nodes.register_node
        self.nodes_knowing = nodes.nodes_knowing
        self.node_schedule_keys = nodes.node_schedule_keys
        self.heartbeat = nodes.heartbeat
        self.database_time = nodes.database_time
        self.set_node_queues = nodes.set_node_queues
        self.remove_node = nodes.remove_node
        self.node_heartbeats = nodes.node_heartbeats
        self.live_node_queues = nodes.live_node_queues
        self.list_nodes = nodes.list_nodes
        self.recover_orphans = nodes.recover_orphans
        masters = MasterRows(self.state)
        self.upsert_master = masters.upsert_master
        self.fire_master = masters.fire_master
        self.fire_masters = masters.fire_masters
        self.set_master_status = masters.set_master_status
        self.run_master_now = masters.run_master_now
        self.list_masters = masters.list_masters
        dead_letters = DeadLetterRows(self.state)
        self.list_jobs = dead_letters.list_jobs
        self.retry_failed = dead_letters.retry_failed
        self.purge_failed = dead_letters.purge_failed
        self.due_alert_windows = dead_letters.due_alert_windows
        self.close_alert_window = dead_letters.close_alert_window
        self.alert_states = dead_letters.alert_states
        pauses = PauseRows(self.state)
        self.pause_queue = pauses.pause_queue
        self.resume_queue = pauses.resume_queue
        self.paused_queues = pauses.paused_queues
        control = ControlRows(self.state)
        self.broadcast = control.broadcast
        self.commands_since = control.commands_since
        self.reply = control.reply
        self.replies = control.replies
        self.drop_replies = control.drop_replies

    @property
    def priority_boost_minutes(self) -> float:
        return self.state.priority_boost_minutes

    @property
    def dlq_alert_task(self) -> str | None:
        return self.state.dlq_alert_task

    def announce(self, word: str) -> None:
        with self.state.lock:
            self.announced.append(word)

    def another(
        self,
        *,
        priority_boost_minutes: float | None = None,
        dlq_alert_task: str | None = None,
    ) -> MemoryStore:
        """A second store on the same rows, clock and lock, with options of its own: what
        another node's JobStore on the same database is."""
        if priority_boost_minutes is None:
            priority_boost_minutes = self.priority_boost_minutes
        return MemoryStore(
            priority_boost_minutes=priority_boost_minutes,
            dlq_alert_task=dlq_alert_task,
            shared=self.state,
        )

    def snapshot(self) -> Tables:
        """A copy of every row held: what a test reads where it would query a database."""
        with self.state.lock:
            return copy.deepcopy(self.state.t)

    def forge(self, change: Callable[[Tables], None]) -> None:
        """Change rows as no operation would: what a test does where it would write SQL."""
        with self.state.lock:
            change(self.state.t)

    def clock(self) -> datetime:
        """The store's time (``ControlStore.clock``)."""
        return self.now()
