"""The contract suite's stores: each database of the run, and the in-memory store.

A test taking ``store`` runs on the in-memory store too, unless :data:`JOBSTORE_ONLY` names
it (or its file) with the reason: the one place that says which contract tests the
in-memory store does not keep.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.memory import MemoryStore
from tests.conftest import DIALECTS, empty_store

MEMORY = "memory"

#: Contract tests (a file, or file::test) that need what only JobStore has, and why.
_SQL = "it writes or reads rows with SQL on the store's engine"
_INDEX = "it drops the database's unique index on active business keys"
_CALLERS = "it enqueues inside a caller's own database transaction (enqueue_within)"
_FAULTS = "its faults are injected into the database connection"
_BATCHES = "batches, chords and streams (store/batches.py) are JobStore's alone"
JOBSTORE_ONLY: dict[str, str] = {
    "test_archive_and_logs.py": "the archive and job logs are JobStore's alone",
    "test_batch_progress.py": _BATCHES,
    "test_batches_store.py": _BATCHES,
    "test_stream_store.py": _BATCHES,
    "test_purge.py": _BATCHES,
    "test_dashboard_reads.py": "the dashboard's reads (store/inspection.py) are SQL",
    "test_metrics.py": "the metrics' reads (store/metrics_reads.py) are SQL",
    "test_hostile_input.py": "the limits it holds are a database's: column sizes, NUL "
    "characters, driver errors; memory holds any text",
    "test_hostile_rows.py": "its rows are forged with SQL, past what the store writes",
    "test_index_plans.py": "query plans are a database's",
    "test_plain_insert.py": "it tests the insert's driver paths",
    "test_step_handoff.py": "the chain step hand-off (release_step_to) is JobStore's alone",
    "test_control_store.py::test_an_older_database_gets_the_control_tables": "schema upgrade",
    "test_task_handoff.py::test_a_node_table_of_an_earlier_version_gains_task_names": "schema",
    "test_task_handoff.py::test_a_task_list_written_by_hand_that_is_not_a_list_of_names_"
    "says_nothing": _SQL,
    "test_jobstore.py::test_successes_with_their_results_are_written_as_the_backend_"
    "writes_each": _SQL,
    "test_jobstore.py::test_one_settle_of_many_outcomes_writes_each_as_alone": _SQL,
    "test_jobstore.py::test_untracked_results_get_a_finished_row": "the result backend's own "
    "writes (store_untracked_result, forget) are JobStore's alone",
    "test_jobstore.py::test_groups_are_saved_and_restored": "group results are JobStore's alone",
    "test_jobstore.py::test_live_schema_matches_the_schema_code": "schema",
    "test_jobstore.py::test_tables_of_an_earlier_version_are_brought_up_to_date": "schema",
    "test_permits_and_aging.py::test_a_retry_and_orphan_recovery_release_permits": _SQL,
    "test_control_store.py::test_expired_rows_are_deleted_by_the_next_broadcast": _SQL,
    "test_dlq_alerts.py::test_dead_letters_of_orphan_recovery_are_counted": _SQL,
    "test_business_keys.py::test_an_older_table_gets_the_unique_index_through_the_upgrade": _INDEX,
    "test_business_keys.py::test_an_upgrade_over_duplicate_active_keys_says_which_jobs": _INDEX,
    "test_business_keys.py::test_duplicate_active_keys_of_an_older_version_do_not_stop_a_"
    "process_starting": _INDEX,
    "test_business_keys.py::test_a_missing_index_is_a_clear_error_not_a_driver_error": _INDEX,
    "test_queue_pauses.py::test_tables_of_a_version_before_pauses_have_none_and_say_how_"
    "to_add_them": "schema",
    "test_business_keys.py::test_a_job_purged_while_its_dead_letter_retry_reads_it_leaves_"
    "its_chain_revoked": "memory reads and requeues under one lock: no purge comes between",
    "test_business_keys.py::test_a_held_key_inside_a_callers_transaction_leaves_it_"
    "usable": _CALLERS,
    "test_business_keys.py::test_a_held_key_inside_a_callers_transaction_does_not_lock_"
    "the_holder": _CALLERS,
    "test_business_keys.py::test_a_key_held_since_a_repeatable_read_callers_snapshot_"
    "names_the_holder": _CALLERS,
    "test_business_keys.py::test_a_key_an_open_transaction_holds_past_the_lock_wait_is_"
    "store_busy_not_a_driver_error": _CALLERS,
    "test_business_keys.py::test_a_deadlock_between_two_callers_transactions_is_the_"
    "stores_error": _CALLERS,
    "test_business_keys.py::test_a_callers_connection_lost_in_its_transaction_says_the_"
    "transaction_ended": _CALLERS,
    "test_permits_and_aging.py::test_rows_with_broker_sized_priorities_are_still_claimed": _SQL,
    "test_recurring_store.py::test_a_lost_claim_among_masters_fired_together_stops_only_"
    "its_own": _SQL,
    "test_lost_replies.py::test_a_claim_whose_reply_was_lost_is_taken_over": _FAULTS,
    "test_lost_replies.py::test_a_claim_whose_driver_connection_is_lost_after_it_ran_is_"
    "taken_over": _FAULTS,
    "test_lost_replies.py::test_an_enqueue_whose_reply_was_lost_is_not_a_duplicate": _FAULTS,
    "test_lost_replies.py::test_a_chain_step_handed_over_whose_reply_was_lost_is_read_back_"
    "as_claimed": _FAULTS,
    "test_lost_replies.py::test_a_group_write_whose_commit_reply_was_lost_is_not_a_"
    "duplicate": _FAULTS,
}


def _jobstore_only(nodeid: str) -> str | None:
    path, _, name = nodeid.partition("::")
    file = path.rpartition("/")[2]
    return JOBSTORE_ONLY.get(f"{file}::{name.partition('[')[0]}") or JOBSTORE_ONLY.get(file)


def _on_memory(metafunc: pytest.Metafunc) -> bool:
    """Whether the test runs on the in-memory store too: it takes ``store``, and neither
    the database's URL (with which it opens connections, threads or processes of its own;
    ``open_store`` is the way that keeps to the store) nor an entry of JOBSTORE_ONLY."""
    names = metafunc.fixturenames
    return (
        "store" in names
        and "db_url" not in names
        and _jobstore_only(metafunc.definition.nodeid) is None
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "dialect" not in metafunc.fixturenames:
        return
    backends = list(DIALECTS)
    if _on_memory(metafunc):
        backends.append(MEMORY)
    metafunc.parametrize("dialect", backends, indirect=True)


@pytest.fixture
def dialect(request: pytest.FixtureRequest) -> str:
    """A database of the run (tests/conftest.py), or the in-memory store."""
    return str(request.param)


@pytest.fixture
def store(dialect: str, request: pytest.FixtureRequest) -> JobStore | MemoryStore:
    if dialect == MEMORY:
        return MemoryStore()
    return empty_store(request.getfixturevalue("db_url"))


@pytest.fixture
def open_store(
    store: JobStore | MemoryStore, request: pytest.FixtureRequest
) -> Callable[..., JobStore | MemoryStore]:
    """Opens another store on the test's jobs, with options of its own (as another node's):
    a JobStore on the database's URL, or a MemoryStore on the same rows."""
    if isinstance(store, MemoryStore):
        return store.another
    url = request.getfixturevalue("db_url")
    return functools.partial(JobStore, url)
