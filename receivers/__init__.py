"""What receiving applications embed so at-least-once deliveries have at-most-once effects.

Every public name is imported when first named, so that a part of the package (``receivers.wire``,
which the outbox's client speaks; ``IdempotentConsumer``, whose ``receivers.kafka`` imports aiokafka;
the RabbitMQ and NATS consumers, which import aio-pika and nats-py) loads only what it uses.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .asgi import IdempotencyMiddleware
    from .engine import RELEASE_STATUSES, Idempotency, IdempotencyContext
    from .kafka import IdempotentConsumer
    from .nats import IdempotentJetStreamConsumer
    from .rabbitmq import IdempotentRabbitMQConsumer
    from .records import RecordStore, State, StoredResponse
    from .stores import MemoryRecordStore, PostgresRecordStore, SqliteRecordStore
    from .wire import InvalidSignature, verify_signature

__all__ = [
    "RELEASE_STATUSES",
    "Idempotency",
    "IdempotencyContext",
    "IdempotencyMiddleware",
    "IdempotentConsumer",
    "IdempotentJetStreamConsumer",
    "IdempotentRabbitMQConsumer",
    "InvalidSignature",
    "MemoryRecordStore",
    "PostgresRecordStore",
    "RecordStore",
    "SqliteRecordStore",
    "State",
    "StoredResponse",
    "verify_signature",
]

#: Each public name, and the module it is imported from when first named.
_LAZY = {
    "IdempotencyMiddleware": "asgi",
    **dict.fromkeys(("RELEASE_STATUSES", "Idempotency", "IdempotencyContext"), "engine"),
    "IdempotentConsumer": "kafka",
    "IdempotentJetStreamConsumer": "nats",
    "IdempotentRabbitMQConsumer": "rabbitmq",
    **dict.fromkeys(("RecordStore", "State", "StoredResponse"), "records"),
    **dict.fromkeys(("MemoryRecordStore", "PostgresRecordStore", "SqliteRecordStore"), "stores"),
    **dict.fromkeys(("InvalidSignature", "verify_signature"), "wire"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
