"""Durable intents for at-least-once effects: record, inspect, and the registries they need.

``Outbox`` and the store's types are imported when first named, so that ``outbox.client`` (a
producer host's only need) loads neither the store nor its database drivers."""

from typing import TYPE_CHECKING, Any

from .clock import Clock, ManualClock, SystemClock
from .destinations import Destination, DestinationSpec
from .digest import canonical_json, payload_digest
from .errors import (
    AmbiguousActionId,
    DestinationInUse,
    FanoutTooLarge,
    IllegalTransition,
    IntentConflict,
    InvalidInput,
    LastAdmin,
    NotFound,
    NoTransaction,
    OutboxError,
    PayloadTooLarge,
    SchemaTooNew,
    SecretsKeyError,
    StaleWrite,
    StoreUnavailable,
    UnknownDestination,
)
from .events import Delivery, EventQuery, Published, StoredEvent
from .model import (
    TRANSITIONS,
    Attempt,
    Enqueued,
    Event,
    EventKind,
    Intent,
    OnUnknown,
    Outcome,
    Role,
    Status,
    Submission,
)
from .settings import Settings
from .topics import Subscription

if TYPE_CHECKING:
    from .outbox import Outbox, OutboxTransaction
    from .producer import AsyncProducer, Producer
    from .store import IntentQuery, Page

#: What is imported when first named, and from where.
_LAZY = {"Outbox": "outbox", "OutboxTransaction": "outbox", "IntentQuery": "store", "Page": "store",
         "Producer": "producer", "AsyncProducer": "producer"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "TRANSITIONS",
    "AmbiguousActionId",
    "AsyncProducer",
    "Attempt",
    "Clock",
    "Delivery",
    "Destination",
    "DestinationInUse",
    "DestinationSpec",
    "Enqueued",
    "Event",
    "EventKind",
    "EventQuery",
    "FanoutTooLarge",
    "IllegalTransition",
    "Intent",
    "IntentConflict",
    "IntentQuery",
    "InvalidInput",
    "LastAdmin",
    "ManualClock",
    "NoTransaction",
    "NotFound",
    "OnUnknown",
    "Outbox",
    "OutboxError",
    "OutboxTransaction",
    "Outcome",
    "Page",
    "PayloadTooLarge",
    "Producer",
    "Published",
    "Role",
    "SchemaTooNew",
    "SecretsKeyError",
    "Settings",
    "StaleWrite",
    "Status",
    "StoreUnavailable",
    "StoredEvent",
    "Submission",
    "Subscription",
    "SystemClock",
    "UnknownDestination",
    "canonical_json",
    "payload_digest",
]
