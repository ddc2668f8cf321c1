"""What kombu loads of celery_ratchet while Celery is imported, in every process.

kombu imports the ``kombu.serializers`` entry points of every installed package when its
serialization module is first imported, which Celery's app module does before any app can
be made. celery_ratchet's entry point names this module, so that every Celery app of a
process is looked at as it is made (:mod:`celery_ratchet.celery.app.first_use`), also in a
process that never imports celery_ratchet itself: one whose app only names
``task_cls="celery_ratchet:RatchetTask"`` and first sends by name, reads a result or pings
workers. It is the one package code Celery runs in every process before an app exists.

Importing it imports nothing of Celery's app module (kombu's import is still under way).
"""

from __future__ import annotations

from celery_ratchet.celery.app.first_use import watch_new_apps

watch_new_apps()

#: What kombu registers for the entry point (``register(name, encoder, decoder,
#: content_type)``): a name for a content type of its own, with no encoder and no decoder,
#: so no message is ever encoded or accepted by it.
KOMBU_SERIALIZER = (None, None, "application/x-celery-ratchet-autoload")
