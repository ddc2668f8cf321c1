"""The chunks a pipelined executemany of job rows is cut into."""

from __future__ import annotations

from typing import Any

from celery_ratchet.store.job_rows import PIPELINE_BYTES, PIPELINE_ROWS, pipeline_chunks


def _row(i: int, size: int = 10) -> dict[str, Any]:
    return {"p_job_id": str(i), "p_payload": b"x" * size, "p_headers": "", "p_properties": ""}


def test_small_rows_go_by_the_row_count_in_order() -> None:
    rows = [_row(i) for i in range(2 * PIPELINE_ROWS + 1)]
    chunks = list(pipeline_chunks(rows))
    assert [len(c) for c in chunks] == [PIPELINE_ROWS, PIPELINE_ROWS, 1]
    assert [r for c in chunks for r in c] == rows


def test_large_rows_go_by_their_bytes_and_one_larger_than_a_chunk_goes_alone() -> None:
    third = PIPELINE_BYTES // 3
    rows = [_row(0, third), _row(1, third), _row(2, third), _row(3, 2 * PIPELINE_BYTES), _row(4)]
    chunks = list(pipeline_chunks(rows))
    assert [[r["p_job_id"] for r in c] for c in chunks] == [["0", "1", "2"], ["3"], ["4"]]


def test_nothing_gives_no_chunk() -> None:
    assert list(pipeline_chunks([])) == []
