"""A chain's next step, released and claimed for one node in one statement.

A chain's later steps are stored ahead as WAITING rows; the step before each releases it
(WAITING to PENDING), and a node claims it like any due job. A node that runs the step in
its own process can instead take the released step itself: the release writes the claim
too (RUNNING, this node, a new claim token). That saves the claim transaction and the
wake-up's round trip on every step of a chain. Everything else about the claim is as any
claim's: the claim token fences the execution, orphan recovery takes it back if the node
dies, the claim check hands it back if the node loses track of it.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from sqlalchemy import bindparam, exists, select, type_coerce, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import ClaimedJob, JobStatus, NewJob
from celery_ratchet.store.claim_sql import RETURNED, Claimed, decode, fetch_claimed
from celery_ratchet.store.claims import Claims
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import db_now
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import transaction
from celery_ratchet.store.job_rows import job, job_params, new_job_values
from celery_ratchet.store.raw import RawStatement, raw_statement
from celery_ratchet.store.row_writer import RowWriter
from celery_ratchet.store.schema import UTCDateTime, scheduler_queue_pause


class StepHandoff:
    """A chain's next step released as claimed by the node that sent it. ``claims``: the
    claim's adoption and failure of what cannot run; ``rows``: the size check."""

    def __init__(self, db: Database, dialect: Dialect, claims: Claims, rows: RowWriter) -> None:
        self.db = db
        self.dialect = dialect
        self.claims = claims
        self.rows = rows

    def release_step_to(self, new: NewJob, node_id: str) -> ClaimedJob | None:
        """Release the WAITING chain step ``new`` (sent by the step before it) as claimed
        by ``node_id``. None, with nothing written, when there is no such waiting row
        (a step not stored ahead, released already, or cancelled) or it cannot be run as
        it is: the caller then sends it the usual way, which decides."""
        if new.resource is not None or new.due is not None or new.business_key is not None:
            return None
        self.rows.check_packet([new], ())
        token = uuid.uuid4().hex
        params = {**job_params(new), "node": node_id, "token": token}

        def release(conn: Connection) -> Claimed:
            if not self.dialect.updates_returning:  # no UPDATE ... RETURNING: the row is read back
                with transaction(conn):
                    if conn.execute(self._handoff_statement, params).rowcount != 1:
                        return Claimed([], [])
                    rows = conn.execute(self.claims.select_claimed, {"token": token}).all()
                return decode(rows, token)
            # Through the driver, as the claim: the release is on every chain step's way.
            return fetch_claimed(conn, self._raw_handoff, params)

        # As any claim: a try whose reply was lost is adopted by its token, and a released
        # step that cannot be run is failed.
        released = self.claims.claiming(token, release, "the chain step was not released")
        return released[0] if released else None

    def _handoff_values(self) -> dict[str, Any]:
        released = new_job_values()
        released.pop("group_id")  # as any release: the group the step was frozen with,
        released.pop("job_type")  # its type
        released.pop("business_key")
        released.pop("claims")
        return {
            **released,
            "created_at": db_now(),
            "status": JobStatus.RUNNING.value,
            "scheduled_time": db_now(),
            "picked_by": bindparam("node"),
            "claim_token": bindparam("token"),
            "claimed_at": db_now(),
            "started_at": None,
            "claims": 1,
        }

    @functools.cached_property
    def _handoff_statement(self) -> Any:
        return (
            update(job)
            .where(
                job.c.job_id == bindparam("p_job_id"),
                job.c.status == JobStatus.WAITING.value,
                job.c.resource.is_(None),
                # A step of a paused queue is released as usual, to wait there: read in the
                # hand-over itself, a pause the node has not seen yet holds.
                ~exists(
                    select(scheduler_queue_pause.c.queue).where(
                        scheduler_queue_pause.c.queue == bindparam("p_queue")
                    )
                ),
            )
            .values(**self._handoff_values())
        )

    @functools.cached_property
    def _raw_handoff(self) -> RawStatement:
        returned = [job.c[name.strip()] for name in RETURNED.split(",")]
        claimed_now = type_coerce(db_now(), UTCDateTime()).label("claimed_now")
        statement = self._handoff_statement.returning(*returned, claimed_now)
        return raw_statement(statement, self.db.engine.dialect)
