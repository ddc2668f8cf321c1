"""Found by ``app.autodiscover_tasks()``."""

from __future__ import annotations

from celery import shared_task

from orders.models import Order


@shared_task
def ship(order_id: int) -> str:
    # The job was written in the transaction that created the order: the row is there.
    order = Order.objects.get(id=order_id)
    order.shipped = True
    order.save(update_fields=["shipped"])
    return f"shipped {order.quantity} x {order.item}"
