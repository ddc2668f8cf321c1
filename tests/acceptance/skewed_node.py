"""One send of the acceptance app from a process of its own, run under libfaketime (a node
whose clock is off): ``python -m tests.acceptance.skewed_node countdown <id> <seconds>`` or
``... schedule <business key> every <seconds>`` or ``... schedule <business key> cron <cron>``.
"""

from __future__ import annotations

import sys

from celery_ratchet import schedule_recurring
from tests.acceptance.app import app, double


def main(argv: list[str]) -> None:
    what, key, *rest = argv
    if what == "countdown":
        double.apply_async((1,), countdown=float(rest[0]), task_id=key)
    elif what == "schedule" and rest[0] == "every":
        schedule_recurring(app, None, "UTC", double.si(1), business_key=key, every=float(rest[1]))
    elif what == "schedule" and rest[0] == "cron":
        schedule_recurring(app, rest[1], "UTC", double.si(1), business_key=key)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
