"""What receiving applications embed so at-least-once deliveries have at-most-once effects."""

from .asgi import IdempotencyMiddleware
from .engine import Idempotency, IdempotencyContext
from .records import RecordStore, State, StoredResponse
from .stores import MemoryRecordStore, PostgresRecordStore, SqliteRecordStore
from .wire import InvalidSignature, verify_signature

__all__ = [
    "Idempotency",
    "IdempotencyContext",
    "IdempotencyMiddleware",
    "InvalidSignature",
    "MemoryRecordStore",
    "PostgresRecordStore",
    "RecordStore",
    "SqliteRecordStore",
    "State",
    "StoredResponse",
    "verify_signature",
]
