"""Place an order and ship it in one transaction; report a task's state by its id."""

from __future__ import annotations

import json

from celery.result import AsyncResult
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from shop.celery import app

from orders.models import Order
from orders.tasks import ship

#: The most one order may ask for: more is refused after the order row and its job were
#: written, which rolls both back.
STOCK = 10


class OutOfStock(Exception):
    pass


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    wanted = json.loads(request.body)
    task_id = None
    try:
        with transaction.atomic():
            order = Order.objects.create(item=wanted["item"], quantity=wanted["quantity"])
            # The job row is written through Django's connection, in this transaction: it
            # exists if and only if the order does (celery_ratchet.contrib.django).
            task_id = ship.delay(order.id).id
            if order.quantity > STOCK:
                raise OutOfStock(f"only {STOCK} left")
    except OutOfStock as exc:
        return JsonResponse({"refused": str(exc), "task_id": task_id}, status=409)
    return JsonResponse({"order_id": order.id, "task_id": task_id}, status=201)


@require_GET
def order_detail(request: HttpRequest, order_id: int) -> JsonResponse:
    order = Order.objects.filter(id=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    return JsonResponse({"id": order.id, "item": order.item, "shipped": order.shipped})


@require_GET
def task_status(request: HttpRequest, task_id: str) -> JsonResponse:
    result = AsyncResult(task_id, app=app)
    body = {"task_id": task_id, "state": result.state}
    if result.successful():
        body["result"] = result.result
    return JsonResponse(body)
