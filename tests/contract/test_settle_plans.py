"""PostgreSQL settles a node's outcomes with one ``UPDATE … FROM unnest(…)``, prepared once per
connection. Its generic plan (the one a prepared statement gets after a few runs) must look
up each job by its id, however few RUNNING rows the statistics last counted: read through the
index on (status, picked_by), every settle of a few jobs reads every running job of the
cluster (measured: 3 ms a batch of 10 among 2,000 running, against 0.8 ms)."""

from __future__ import annotations

from typing import Any

from celery_ratchet.domain.job import JobStatus, Settlement, StoredResult
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.settle import _RESULT_ARRAYS, _SETTLE_ARRAYS, _as_arrays
from tests.conftest import Servers, empty_store
from tests.helpers import new_job


def _generic_plan(store: JobStore, raw: Any, values: dict[str, Any]) -> str:
    with store.engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        # As in test_index_plans: a sequential scan would be the cheaper plan of a table this
        # small (it is the generic plan of 300 rows), which is not the question here.
        cursor.execute("SET enable_seqscan = off")
        try:
            # EXPLAIN of a statement with parameters plans it as a prepared statement would.
            cursor.execute("EXPLAIN " + raw.sql, raw.parameters(values))
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("RESET enable_seqscan")
            cursor.close()


def test_a_settle_looks_each_job_up_by_its_id_whatever_the_statistics_say(
    servers: Servers,
) -> None:
    store = empty_store(servers.url("postgresql"))  # the statements over unnest are its own
    store.enqueue_many([new_job(f"j{i}") for i in range(300)])
    with store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE scheduler_job")  # counted while none is RUNNING
    claimed = store.claim("n", ["celery"], 300)
    few = [Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in claimed[:3]]
    settle_rows = [
        {"p_job_id": s.job_id, "p_token": s.token, "p_status": s.status.value,
         "p_error": None, "p_traceback": None}
        for s in few
    ]  # fmt: skip
    result_rows = [
        {**row, "p_job_result": '"x"', "p_result_type": "str", "p_result_meta": None}
        for row in settle_rows
    ]
    for raw, values in (
        (store.settler._raw_settle_many, _as_arrays(settle_rows, _SETTLE_ARRAYS)),
        (store.settler._raw_store_results_pg, _as_arrays(result_rows, _RESULT_ARRAYS)),
    ):
        plan = _generic_plan(store, raw, values)
        assert "ux_scheduler_job_job_id" in plan, plan
        assert "ix_scheduler_job_owner" not in plan, plan
    # And the statements still do what they did.
    store.settle(few[:2])
    store.settle([Settlement(few[2].job_id, few[2].token, JobStatus.SUCCEEDED,
                             result=StoredResult('"x"', "str", None))])  # fmt: skip
    assert store.count_by_status() == {"SUCCEEDED": 3, "RUNNING": 297}


def test_a_prepared_settle_of_a_few_jobs_keeps_its_plan(servers: Servers) -> None:
    """Given the arrays directly, the planner knew each batch's length: the plan for any
    batch (ten rows) looked dearer than one for fewer, and every settle of fewer than ten
    (a lightly loaded worker's, or one storing results) was planned again."""
    store = empty_store(servers.url("postgresql"))
    store.enqueue_many([new_job(f"j{i}") for i in range(100)])
    claimed = store.claim("n", ["celery"], 100)
    stored = 0
    with store.engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()
        try:
            for raw, with_result in ((store.settler._raw_settle_many, False),
                                     (store.settler._raw_store_results_pg, True)):  # fmt: skip
                for _ in range(12):
                    batch, claimed = claimed[:3], claimed[3:]
                    rows = [
                        {"p_job_id": j.job_id, "p_token": j.token, "p_status": "SUCCEEDED",
                         "p_error": None, "p_traceback": None, "p_job_result": '"x"',
                         "p_result_type": "str", "p_result_meta": None}
                        for j in batch
                    ]  # fmt: skip
                    arrays = _as_arrays(rows, _RESULT_ARRAYS if with_result else _SETTLE_ARRAYS)
                    cursor.execute(raw.sql, raw.parameters(arrays), prepare=True)
                    stored += cursor.rowcount
            cursor.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'UPDATE scheduler_job AS j %%' ORDER BY statement"
            )
            plans = cursor.fetchall()
        finally:
            cursor.close()
    assert stored == 72
    assert len(plans) == 2
    for generic, custom in plans:
        assert generic >= 6, plans
        assert custom <= 5, plans
