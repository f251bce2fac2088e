"""The outbox as a Django app: enqueue on a Django database's connection inside the current
``transaction.atomic()`` block (``ATOMIC_REQUESTS`` included), so the intent commits with the
view's rows or not at all; the outbox's own tables come with Django's ``migrate`` (or
``manage.py outbox_migrate``: ``schema``).

    INSTALLED_APPS = [..., "outbox.contrib.django"]
    OUTBOX = {"DATABASE": "default"}        # optional: the alias, and any outbox setting by name

    from outbox.contrib.django import enqueue

    with transaction.atomic():
        order = Order.objects.create(total_cents=1999)
        enqueue(destination="billing", scope="acme", payload={"order": order.pk})

The results and errors are ``outbox.Producer``'s: ``Enqueued``, and a refusal (IntentConflict,
UnknownDestination, InvalidInput) raised before anything is written, leaving the atomic block
usable; outside any atomic block, in Django's autocommit, NoTransaction. The app registers no
models and nothing in the admin: the outbox's tables are its own, and the outbox's service
(``outbox worker``) delivers what the transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack

from .conf import database_alias, producer

if TYPE_CHECKING:
    from ...events import Published
    from ...intake import EventFields, IntentFields
    from ...model import Enqueued


def enqueue(*, using: str | None = None, **intent: Unpack[IntentFields]) -> Enqueued:
    """Record an intent in the current transaction of the database ``using`` (default: the
    ``OUTBOX["DATABASE"]`` alias); the fields are ``Outbox.enqueue``'s."""
    return producer().enqueue(_connection(using), **intent)


def enqueue_many(intents: Iterable[Mapping[str, Any]], *, using: str | None = None) -> list[Enqueued]:
    """Record several intents in the current transaction of ``using``, all or none (as
    ``Producer.enqueue_many``): the first refusal is raised with none of them written."""
    return producer().enqueue_many(_connection(using), intents)


def publish(*, using: str | None = None, **event: Unpack[EventFields]) -> Published:
    """Record an event in the current transaction of ``using``, with one intent per destination
    subscribed to its topic; the fields are ``Outbox.publish``'s."""
    return producer().publish(_connection(using), **event)


def _connection(using: str | None) -> Any:
    from django.db import connections

    return connections[database_alias(using)]


__all__ = ["database_alias", "enqueue", "enqueue_many", "producer", "publish"]
