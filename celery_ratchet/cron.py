"""``celery_ratchet.cron.CronExpression``: Quartz cron, evaluated in an IANA time zone."""

from celery_ratchet.domain.cron import CronError, CronExpression

__all__ = ["CronError", "CronExpression"]
