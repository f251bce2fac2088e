"""What receiving applications embed so at-least-once deliveries have at-most-once effects.

``IdempotentConsumer`` (``receivers.kafka``) is loaded on first use, so that only applications
consuming Kafka import aiokafka.
"""

from typing import TYPE_CHECKING, Any

from .asgi import IdempotencyMiddleware
from .engine import RELEASE_STATUSES, Idempotency, IdempotencyContext
from .records import RecordStore, State, StoredResponse
from .stores import MemoryRecordStore, PostgresRecordStore, SqliteRecordStore
from .wire import InvalidSignature, verify_signature

__all__ = [
    "RELEASE_STATUSES",
    "Idempotency",
    "IdempotencyContext",
    "IdempotencyMiddleware",
    "IdempotentConsumer",
    "InvalidSignature",
    "MemoryRecordStore",
    "PostgresRecordStore",
    "RecordStore",
    "SqliteRecordStore",
    "State",
    "StoredResponse",
    "verify_signature",
]

if TYPE_CHECKING:
    from .kafka import IdempotentConsumer


def __getattr__(name: str) -> Any:
    if name == "IdempotentConsumer":
        from .kafka import IdempotentConsumer

        return IdempotentConsumer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
