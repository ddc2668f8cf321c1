"""Which live node lists a job waiting for its due time in ``celery inspect scheduled``."""

from __future__ import annotations

from collections import Counter

from celery_ratchet.domain.control import lister_of

NODES = {"a": ["celery", "mail"], "b": ["celery"], "c": ["reports"]}


def test_a_job_is_listed_by_one_node_consuming_its_queue_whatever_the_order_read() -> None:
    reordered = dict(reversed(list(NODES.items())))
    for n in range(200):
        chosen = lister_of(f"job-{n}", "celery", NODES)
        assert chosen in {"a", "b"}
        assert lister_of(f"job-{n}", "celery", reordered) == chosen
    assert lister_of("job-1", "mail", NODES) == "a"
    assert lister_of("job-1", "reports", NODES) == "c"


def test_no_live_node_of_the_queue_lists_nothing() -> None:
    assert lister_of("job-1", "other", NODES) is None
    assert lister_of("job-1", "celery", {}) is None


def test_jobs_spread_over_the_nodes_and_a_node_gone_hands_on_only_its_own() -> None:
    jobs = [f"job-{n}" for n in range(1000)]
    before = {j: lister_of(j, "celery", NODES) for j in jobs}
    counts = Counter(before.values())
    assert 400 < counts["a"] < 600
    without_b = {k: v for k, v in NODES.items() if k != "b"}
    after = {j: lister_of(j, "celery", without_b) for j in jobs}
    assert all(after[j] == "a" for j in jobs)
    assert all(after[j] == before[j] for j in jobs if before[j] == "a")
