"""Recurring jobs without beat: ``@recurring``, ``schedule_recurring`` and ``beat_schedule``
registered as masters in the store, and the housekeeping every app carries (the archiver,
job logs)."""
