"""Streaming batches for the acceptance tests and the bench: the acceptance app with a
child task per item, callbacks that note the outcome, and a producer process.

    python -m tests.acceptance.stream_app COUNT [--chunk-size N] [--chunked] [--pace S]
        [--lease S] [--name NAME]

streams COUNT items (0: without end) and prints one JSON line: the batch, how long the
stream took, and the producer's peak RSS (``ru_maxrss``) before and after streaming.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import text

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.app import SIDE_EFFECTS, app, record_run

__all__ = ["app"]


@app.task(name="acc.stream_item")
def stream_item(n: int) -> None:
    record_run(f"item-{n}")


@app.task(name="acc.stream_chunk")
def stream_chunk(items: list[int]) -> int:
    """One row per item, in one statement."""
    with ratchet_state(app).store.engine.connect() as conn:
        conn.execute(
            text(f"INSERT INTO {SIDE_EFFECTS} (run_key, pid, ppid) VALUES (:k, 0, 0)"),
            [{"k": f"item-{n}"} for n in items],
        )
    return len(items)


@app.task(name="acc.stream_done")
def stream_done(summary: dict[str, Any]) -> None:
    record_run(f"done:{summary['total']}:{summary['succeeded']}:{summary['failed']}")


@app.task(name="acc.stream_failed")
def stream_failed(summary: dict[str, Any]) -> None:
    record_run(f"failed:{summary['written']}:{summary['total']}")


def _peak_rss_kb() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _items(count: int, pace: float) -> Iterator[int]:
    numbers = itertools.count() if count == 0 else iter(range(count))
    for n in numbers:
        if pace:
            time.sleep(pace)  # a slow source: rows of a query, lines of a file
        yield n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int)
    parser.add_argument("--chunk-size", type=int, default=1000)
    parser.add_argument("--chunked", action="store_true")
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--name", default="Stream")
    args = parser.parse_args()
    make = stream_chunk.s if args.chunked else stream_item.s
    ratchet_state(app).store.ensure_schema()
    before = _peak_rss_kb()
    started = time.monotonic()
    streamed = (
        celery_ratchet.batch(args.name, app=app)
        .on_success(stream_done.s())
        .on_failure(stream_failed.s())
        .stream(
            _items(args.count, args.pace),
            make,
            chunk_size=args.chunk_size,
            chunked=args.chunked,
            lease_seconds=args.lease,
        )
    )
    elapsed = time.monotonic() - started
    report = {
        "batch_id": streamed.id,
        "children": streamed.total,
        "items": streamed.items,
        "seconds": round(elapsed, 2),
        "peak_rss_before_kb": before,
        "peak_rss_kb": _peak_rss_kb(),
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
