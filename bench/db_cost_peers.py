"""pgqueuer and procrastinate sending and draining no-op jobs, for bench/db_cost.py.

Run by bench/db_cost.py with the python of a virtualenv of their own (they are no dependency
of celery_ratchet): ``python bench/db_cost_peers.py SYSTEM STEP --dsn DSN [--jobs N]``, STEP
one of ``schema`` (install the system's tables), ``send`` (N jobs, one call and one commit
each, as an application sends them) and ``drain`` (one worker until none is left; it exits
by itself). Each system as its documentation sets it up, with its defaults, through psycopg.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any


async def pgqueuer_step(step: str, dsn: str, jobs: int, concurrency: int) -> None:
    import psycopg
    from pgqueuer import Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        queries = Queries.from_psycopg_connection(conn)
        if step == "schema":
            await queries.install()  # durable: every table logged (its default)
        elif step == "send":
            for i in range(jobs):
                await queries.enqueue("noop", str(i).encode())
        else:
            manager = QueueManager(queries)

            @manager.entrypoint("noop")
            async def noop(job: Any) -> None:
                return None

            # Its defaults (batches of 10, no cap on concurrent jobs), until none is left.
            await manager.run(mode=QueueExecutionMode.drain)


async def procrastinate_step(step: str, dsn: str, jobs: int, concurrency: int) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app.open_async():
        if step == "schema":
            await app.schema_manager.apply_schema_async()
        elif step == "send":
            for i in range(jobs):
                await noop.defer_async(i=i)
        else:
            # Finished jobs are kept (its default, delete_jobs="never"); wait=False: the
            # worker stops once it has caught up with the queue.
            await app.run_worker_async(concurrency=concurrency, wait=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("step", choices=["schema", "send", "drain"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # It warns that the app is made in the main module, which only matters to its CLI.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    step = pgqueuer_step if args.system == "pgqueuer" else procrastinate_step
    asyncio.run(step(args.step, args.dsn, args.jobs, args.concurrency))


if __name__ == "__main__":
    main()
