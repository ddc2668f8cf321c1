"""The fleet before the cutover: a stock Celery app on a broker (STOCK_BROKER_URL; a Redis one
is its result backend too), with a task of the acceptance app under the same name.

Run as a program, it sends what a test asks for and prints the task ids as JSON: its sends
come from a process of its own, as a fleet's do (a stock app in the test process would take
in the acceptance app's shared tasks, whose base class is ratchet's).

    python -m tests.acceptance.stock_app eta ISO | fleet | many N [QUEUE] | canvas QUEUE ISO
        | zipped
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from typing import Any

from celery import Celery, chain, chord, group

BROKER = os.environ.get("STOCK_BROKER_URL", "redis://127.0.0.1:1/0")
app = Celery("stock", broker=BROKER, backend=BROKER if BROKER.startswith("redis") else None)
app.conf.broker_connection_retry_on_startup = False


@app.task(name="acc.double")
def double(n: int) -> int:
    return n * 2


def sig(name: str, *args: Any, **options: Any) -> Any:
    return app.signature(name, args=args, **options)


def fleet() -> dict[str, Any]:
    """One of each: plain, countdown, priority, retries and headers, expiry, unknown task,
    chain, link, link_error, chord."""
    send = app.send_task
    return {
        "plain": [send("acc.double", args=(n,)).id for n in range(5)],
        "soon": send("acc.double", args=(50,), countdown=1).id,
        "urgent": send("acc.double", args=(60,), priority=7).id,
        "retried": send("acc.double", args=(70,), retries=2, headers={"tenant": "acme"}).id,
        "expired": send("acc.double", args=(80,), expires=1).id,
        "unknown": send("shop.never_registered", args=(1,)).id,
        "chained": chain(sig("acc.step", 0, "chain1"), sig("acc.step", "chain1")).apply_async().id,
        "linked": sig("acc.double", 3).apply_async(link=sig("acc.step", "link1")).id,
        "errback": sig("acc.boom", "no good")
        .apply_async(link_error=sig("acc.step", 0, "err1", immutable=True))
        .id,
        "chorded": chord(
            group(sig("acc.value", n) for n in (1, 2, 3)), sig("acc.chord_body", "chord1")
        )
        .apply_async()
        .id,
    }


def main(argv: list[str]) -> dict[str, Any]:
    what = argv[0]
    if what == "eta":
        eta = datetime.fromisoformat(argv[1])
        return {"held": [app.send_task("acc.double", args=(n,), eta=eta).id for n in (1, 2, 3)]}
    if what == "fleet":
        return fleet()
    if what == "many":
        options = {"queue": argv[2]} if len(argv) > 2 else {}
        with app.producer_or_acquire() as producer:
            sent = [
                app.send_task("acc.double", args=(n,), producer=producer, **options).id
                for n in range(int(argv[1]))
            ]
        return {"sent": sent}
    if what == "canvas":
        queue, eta = argv[1], datetime.fromisoformat(argv[2])
        urgent = app.send_task("acc.double", args=(-1,), eta=eta, priority=7, queue=queue).id
        steps = [sig("acc.step", 0, "amqp-chain", queue=queue), sig("acc.step", "amqp-chain")]
        chained = chain(*steps).apply_async(queue=queue)
        return {"urgent": urgent, "head": chained.parent.id, "chained": chained.id}
    if what == "zipped":  # a chord whose messages are compressed, as task_compression does
        header = group(sig("acc.value", n) for n in (1, 2, 3))
        zipped = chord(header, sig("acc.chord_body", "zipped")).apply_async(compression="zlib")
        return {"chord": zipped.id, "group": zipped.parent.id}
    raise SystemExit(f"unknown request {what!r}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
