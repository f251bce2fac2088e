"""Durable intents for at-least-once effects: record, inspect, and the registries they need."""

from .clock import Clock, ManualClock, SystemClock
from .destinations import Destination, DestinationSpec
from .digest import canonical_json, payload_digest
from .errors import (
    AmbiguousActionId,
    DestinationInUse,
    IllegalTransition,
    IntentConflict,
    InvalidInput,
    NotFound,
    OutboxError,
    PayloadTooLarge,
    SchemaTooNew,
    StaleWrite,
    StoreUnavailable,
    UnknownDestination,
)
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
from .settings import Settings
from .store import IntentQuery, Page

__all__ = [
    "TRANSITIONS",
    "AmbiguousActionId",
    "Attempt",
    "Clock",
    "Destination",
    "DestinationInUse",
    "DestinationSpec",
    "Enqueued",
    "Event",
    "EventKind",
    "IllegalTransition",
    "Intent",
    "IntentConflict",
    "IntentQuery",
    "InvalidInput",
    "ManualClock",
    "NotFound",
    "OnUnknown",
    "Outbox",
    "OutboxError",
    "OutboxTransaction",
    "Outcome",
    "Page",
    "PayloadTooLarge",
    "Role",
    "SchemaTooNew",
    "Settings",
    "StaleWrite",
    "Status",
    "StoreUnavailable",
    "Submission",
    "SystemClock",
    "UnknownDestination",
    "canonical_json",
    "payload_digest",
]
