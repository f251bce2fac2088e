"""Views that write an order and enqueue its invoice in one transaction, each a way an
application does it (or gets it wrong); every request answers JSON."""

import django.db
from django.db import transaction
from django.http import JsonResponse

from outbox import NoTransaction, Producer, UnknownDestination
from outbox.contrib.django import enqueue, enqueue_many, publish

from .models import Order

VIEWS = ("explicit", "failing", "atomic_request", "outside", "refused", "savepoint", "proxy", "many", "event")


def _invoice(pk: int, suffix: str = "") -> dict:
    return {"destination": "billing", "scope": "acme", "action_id": f"order-{pk}{suffix}",
            "payload": {"order": pk, "total_cents": 1999}}


def _created(pk: int, *results) -> JsonResponse:
    return JsonResponse({"order": pk, "created": [r.created for r in results]}, status=201)


@transaction.non_atomic_requests
def explicit(request, pk):
    """Its own ``atomic()`` block, outside ATOMIC_REQUESTS."""
    with transaction.atomic():
        Order.objects.create(id=pk, total_cents=1999)
        sent = enqueue(**_invoice(pk))
    return _created(pk, sent)


@transaction.non_atomic_requests
def failing(request, pk):
    """Its block raises after the enqueue: the order and the intent roll back together."""
    with transaction.atomic():
        Order.objects.create(id=pk, total_cents=1999)
        enqueue(**_invoice(pk))
        raise RuntimeError("the view failed after its enqueue")


def atomic_request(request, pk):
    """No block of its own: ATOMIC_REQUESTS runs it in one (``?fail=1``: and it raises)."""
    Order.objects.create(id=pk, total_cents=1999)
    sent = enqueue(**_invoice(pk))
    if request.GET.get("fail"):
        raise RuntimeError("the view failed after its enqueue")
    return _created(pk, sent)


@transaction.non_atomic_requests
def outside(request, pk):
    """In Django's autocommit, outside any block: refused, nothing written."""
    try:
        enqueue(**_invoice(pk))
    except NoTransaction as exc:
        return JsonResponse({"error": type(exc).__name__, "detail": exc.message}, status=409)
    return JsonResponse({"error": "enqueued outside a transaction"}, status=500)


def refused(request, pk):
    """A refusal caught inside the request's transaction: the order still commits."""
    Order.objects.create(id=pk, total_cents=1999)
    try:
        enqueue(**{**_invoice(pk), "destination": "nowhere"})
    except UnknownDestination as exc:
        return JsonResponse({"order": pk, "refused": exc.message}, status=201)
    return JsonResponse({"error": "an unknown destination was accepted"}, status=500)


def savepoint(request, pk):
    """A nested block (a savepoint) rolled back: its intent goes, the rest stays."""
    Order.objects.create(id=pk, total_cents=1999)
    kept = enqueue(**_invoice(pk))
    try:
        with transaction.atomic():
            enqueue(**_invoice(pk, "-extra"))
            raise ValueError("undo the savepoint")
    except ValueError:
        pass
    return _created(pk, kept)


def proxy(request, pk):
    """``outbox.Producer`` on ``django.db.connection`` (the default alias's proxy), as the core takes it."""
    Order.objects.create(id=pk, total_cents=1999)
    return _created(pk, Producer().enqueue(django.db.connection, **_invoice(pk)))


def many(request, pk):
    """Two intents at once, all or none."""
    Order.objects.create(id=pk, total_cents=1999)
    return _created(pk, *enqueue_many([_invoice(pk, "-a"), _invoice(pk, "-b")]))


def event(request, pk):
    """An event, fanned out to the destinations subscribed to its topic."""
    Order.objects.create(id=pk, total_cents=1999)
    published = publish(scope="acme", topic="order.placed", event_id=f"order-{pk}", payload={"order": pk})
    return JsonResponse({"order": pk, "fanout": [d.action_id for d in published.event.fanout]}, status=201)
