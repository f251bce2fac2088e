"""Durable intents for at-least-once effects: record, inspect, and the registries they need.

Every public name is imported when first named, so that a part of the package (``outbox.client``,
a producer host's only need, or the ``outbox`` command's ``--help``) loads only what it uses."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        NotForTenants,
        NotFound,
        NoTransaction,
        OutboxError,
        OwnedDestination,
        PayloadTooLarge,
        SchemaTooNew,
        SecretsKeyError,
        StaleWrite,
        StoreUnavailable,
        TenantLimit,
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
    from .outbox import Outbox, OutboxTransaction
    from .producer import AsyncProducer, Producer
    from .settings import Settings
    from .store import IntentQuery, Page
    from .topics import Subscription

#: Each public name, and the module it is imported from when first named.
_LAZY = {
    **dict.fromkeys(("Clock", "ManualClock", "SystemClock"), "clock"),
    **dict.fromkeys(("Destination", "DestinationSpec"), "destinations"),
    **dict.fromkeys(("canonical_json", "payload_digest"), "digest"),
    **dict.fromkeys(("AmbiguousActionId", "DestinationInUse", "FanoutTooLarge", "IllegalTransition", "IntentConflict",
                     "InvalidInput", "LastAdmin", "NotForTenants", "NotFound", "NoTransaction", "OutboxError",
                     "OwnedDestination", "PayloadTooLarge", "SchemaTooNew", "SecretsKeyError", "StaleWrite",
                     "StoreUnavailable", "TenantLimit", "UnknownDestination"),
                    "errors"),
    **dict.fromkeys(("Delivery", "EventQuery", "Published", "StoredEvent"), "events"),
    **dict.fromkeys(("TRANSITIONS", "Attempt", "Enqueued", "Event", "EventKind", "Intent", "OnUnknown", "Outcome",
                     "Role", "Status", "Submission"), "model"),
    **dict.fromkeys(("Outbox", "OutboxTransaction"), "outbox"),
    **dict.fromkeys(("AsyncProducer", "Producer"), "producer"),
    "Settings": "settings",
    **dict.fromkeys(("IntentQuery", "Page"), "store"),
    "Subscription": "topics",
}


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
    "NotForTenants",
    "NotFound",
    "OnUnknown",
    "Outbox",
    "OutboxError",
    "OutboxTransaction",
    "Outcome",
    "OwnedDestination",
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
    "TenantLimit",
    "UnknownDestination",
    "canonical_json",
    "payload_digest",
]
