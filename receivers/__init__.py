"""What receiving applications embed so at-least-once deliveries have at-most-once effects."""

from .asgi import IdempotencyMiddleware
from .engine import Idempotency, IdempotencyContext
from .records import RecordStore, State, StoredResponse
from .signature import InvalidSignature, verify_signature
from .stores import MemoryRecordStore, PostgresRecordStore, SqliteRecordStore

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
