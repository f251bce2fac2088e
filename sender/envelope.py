"""What every broker message of an attempt carries besides its payload: the intent's identity,
the attempt and its fence, the attempt's trace and, when the destination holds a signing secret,
its signature. The Kafka channel puts these in record headers; every other broker channel
(RabbitMQ, NATS, Redis Streams, SQS) puts the same names and values where that broker
keeps a message's metadata, so one consumer-side reader (``receivers``) verifies them all.

The signature is Standard Webhooks' (``receivers.wire.sign``) over
``idempotency-key.timestamp.payload``, the idempotency key standing for ``webhook-id``.
"""

from __future__ import annotations

from outbox import tracing
from receivers import wire

from .channel import Send


def payload(send: Send) -> bytes:
    """The message body: the payload's canonical JSON, the bytes its digest is taken over."""
    return send.intent.payload_json.encode()


def headers(send: Send, signing: tuple[str, ...], timestamp: int, body: bytes) -> list[tuple[str, str]]:
    """The message's metadata, in order: identity, attempt, trace, then signature (when
    ``signing`` holds a secret; the destination's newest first) made at ``timestamp``."""
    intent = send.intent
    found = [(wire.KAFKA_IDEMPOTENCY_KEY, intent.key), (wire.KAFKA_PAYLOAD_DIGEST, intent.payload_digest),
             (wire.KAFKA_ATTEMPT_ID, send.attempt_id), (wire.KAFKA_FENCE, str(send.fence)),
             *tracing.carrier(send.context).items()]
    if signing:
        found += [(wire.KAFKA_TIMESTAMP, str(timestamp)),
                  (wire.KAFKA_SIGNATURE, wire.sign(signing, intent.key, timestamp, body))]
    return found
