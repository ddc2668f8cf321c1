"""Control and monitoring from the client's side: ``app.control`` (revoke and purge on the
store, broadcasts written to the store with Celery's mailbox semantics), Celery events over
the events Redis, Flower's two touch points, the dashboard and metrics of an app, and
dead-letter alerts sent through Celery."""
