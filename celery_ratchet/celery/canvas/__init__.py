"""Canvas and workflows completed by the database: chords and batches whose last child swaps
their state and sends what follows (:mod:`~celery_ratchet.celery.canvas.batches`),
``celery_ratchet.batch()``, streamed batches, and ``celery_ratchet.workflow()``'s branches
stored as rows."""
