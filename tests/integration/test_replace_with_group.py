"""A task replaced by a group (``self.replace(group(...))``) as in stock Celery: Celery turns
the group into a chord whose body (``celery.accumulate``) takes the task's id, so the task's
result is the list of the members' results in their order, wherever the task stands: alone,
in a chain, in a group, in a chord's header or body, or with a callback of its own."""

from __future__ import annotations

import celery
import pytest
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError

TIMEOUT = 60

#: Celery's own behaviour before 5.7, not the store's: its group._apply_tasks passed the
#: replaced task's own group_index to every member of the replacing group (so their results,
#: all at one index, come in the order they finished, on Celery's Redis backend as here), and
#: Task.replace gave a chain ending in a group no accumulate to end with. 5.7 fixed both.
needs_celery_5_7 = pytest.mark.skipif(
    tuple(int(p) for p in celery.__version__.split(".")[:2]) < (5, 7),
    reason="Celery before 5.7 orders and ends a replacing group differently (see above)",
)


def test_its_result_is_the_members_results_in_order(worker_app: Celery) -> None:
    result = worker_app.tasks["t.replace_with_group"].delay([1, 2, 3], 10)
    assert result.get(timeout=TIMEOUT) == [11, 12, 13]
    assert result.state == "SUCCESS"


def test_a_replacing_group_of_one_member_gives_a_list_of_one(worker_app: Celery) -> None:
    result = worker_app.tasks["t.replace_with_group"].delay([5], 1)
    assert result.get(timeout=TIMEOUT) == [6]


def test_the_next_step_of_its_chain_gets_the_list(worker_app: Celery) -> None:
    tasks = worker_app.tasks
    result = chain(
        tasks["t.identity"].s([1, 2]),
        tasks["t.replace_with_group"].s(1),
        tasks["t.tsum"].s(),
    ).delay()
    assert result.get(timeout=TIMEOUT) == 5


@needs_celery_5_7
def test_many_replaced_members_of_a_group_keep_the_groups_order(worker_app: Celery) -> None:
    replace = worker_app.tasks["t.replace_with_group"]
    result = group([replace.s([2, 1], 1), replace.s([4, 3], 1)] * 5).delay()
    assert result.get(timeout=TIMEOUT) == [[3, 2], [5, 4]] * 5


@needs_celery_5_7
def test_a_chord_header_member_replaced_by_a_group_gives_its_list_to_the_body(
    worker_app: Celery,
) -> None:
    tasks = worker_app.tasks
    result = chord(
        [tasks["t.identity"].s(1), tasks["t.replace_with_group"].s([1, 2], 1)],
        tasks["t.identity"].s(),
    ).delay()
    assert result.get(timeout=TIMEOUT) == [1, [2, 3]]


def test_a_chord_body_replaced_by_a_group_is_the_chords_result(worker_app: Celery) -> None:
    tasks = worker_app.tasks
    result = chord(
        [tasks["t.add"].s(1, 1), tasks["t.add"].s(2, 2)],
        tasks["t.replace_with_group"].s(10),
    ).delay()
    assert result.get(timeout=TIMEOUT) == [12, 14]


def test_a_chord_body_chain_child_replaced_by_a_group(worker_app: Celery) -> None:
    tasks = worker_app.tasks
    result = chord(
        [tasks["t.add"].s(1, 1), tasks["t.add"].s(2, 2)],
        chain(tasks["t.replace_with_group"].s(10), tasks["t.tsum"].s()),
    ).delay()
    assert result.get(timeout=TIMEOUT) == 26
    last = chord(
        [tasks["t.add"].s(1, 1)],
        chain(tasks["t.identity"].s(), tasks["t.replace_with_group"].s(5)),
    ).delay()
    assert last.get(timeout=TIMEOUT) == [7]


def test_its_callback_gets_the_list(worker_app: Celery) -> None:
    tasks = worker_app.tasks
    callback = tasks["t.tsum"].s()
    callback.freeze()
    result = tasks["t.replace_with_group"].apply_async(([3, 4], 1), link=callback)
    assert result.get(timeout=TIMEOUT) == [4, 5]
    assert worker_app.AsyncResult(callback.id).get(timeout=TIMEOUT) == 9


def test_a_failing_member_fails_the_replaced_task(worker_app: Celery) -> None:
    result = worker_app.tasks["t.replace_with_group"].delay(["x", 2], 1)
    with pytest.raises(ChordError, match="TypeError"):
        result.get(timeout=TIMEOUT)
    assert result.state == "FAILURE"


def test_the_group_outruns_the_task_it_replaced(worker_app: Celery) -> None:
    # Every member ends, and the chord body taking the task's id is sent, while the task
    # still runs: that id was held by the task's RUNNING row (DuplicateJob, ChordError).
    result = worker_app.tasks["t.replace_with_group_and_linger"].delay([1, 2], 1)
    assert result.get(timeout=TIMEOUT) == [2, 3]


@needs_celery_5_7
def test_a_chain_ending_in_a_group_gives_the_groups_list(worker_app: Celery) -> None:
    result = worker_app.tasks["t.replace_with_chain_to_group"].delay(1)
    assert result.get(timeout=TIMEOUT) == [3, 4]
