"""The Kafka channel: one record per intent, produced with ``acks=all`` by the idempotent producer.

What decides an outcome is whether a produce request carrying the record may have left. Until
then nothing can have been appended, and the attempt is ``not_submitted``: the producer could not
start (no broker answered), the topic's metadata never came (an unknown topic, a refusal), the
partition's leader does not take connections, or the record is larger than a request may be.
Once the record is handed to the producer, only the broker's answer says what happened: an
offset (delivered), or an error saying the record was not appended (retryable, or rejected for a
record too large or a topic that cannot exist). A timeout or a lost connection after that is
``maybe_submitted``: the broker may have appended it. The idempotent producer removes the
duplicates its own retries would make; a retry of an unknown outcome by the outbox is a new
record, which the receivers' idempotent consumer recognises by its ``idempotency-key``.

Each record is signed as a webhook is (``receivers.wire``): with the destination's ``whsec_``
secrets (several during a rotation), over ``key.timestamp.value`` with the idempotency key as the
id, in the ``webhook-timestamp`` and ``webhook-signature`` headers, so a consumer holding the
secret tells the outbox's records from anything else written to the topic. A destination's
secrets hold its signing secrets and, after them, its SASL password; one registered before
records were signed holds no signing secret (or only the password) and its records go unsigned.

One producer per destination (as its settings read now), shared by every send to it, so
concurrent sends are batched per partition. A worker's cycle hands over its records at once
(``send_many``): each is handed to the producer (a failure until then is that record's, and
``not_submitted``), then the broker's answers to them all are awaited as one, each record's
result its own. An idempotent producer can end while the process
lives on: a broker that crashed and lost its producer state, or a newer producer that fenced
it, refuses every later record of that producer id (``ENDED``). The Java client then starts
afresh with a new id, and so does this channel: the producer is replaced, and the record it
was refused for is ``maybe_submitted``, since aiokafka may have sent it once before the broker
lost the state (its retries after a lost connection are invisible here).

The SSRF guard: a destination without ``allow_private_network`` never opens a TCP connection to
an address the guard refuses, whether its bootstrap servers name it or the brokers of its
metadata do (``connections``). A refused connection fails the attempt before the
record is handed to the producer: ``not_submitted``, rejected.

The package: ``spec`` (the destination's settings and secrets), ``producers`` (one producer per
destination, and each record's partition), ``channel`` (the sending), ``answers`` (what a record
came to) and ``connections`` (aiokafka's connections through the SSRF guard).
"""

from __future__ import annotations

from receivers import wire

from .. import credentials
from ..channel import ChannelModule
from .channel import KafkaChannel
from .spec import KafkaSpec, keep_secrets

__all__ = ["CHANNEL", "KafkaChannel", "KafkaSpec", "keep_secrets"]

CHANNEL = ChannelModule(
    name="kafka", spec=KafkaSpec, secret_form="a whsec_ secret to sign its records", new_secret=wire.new_secret,
    keep_secrets=keep_secrets, signing=lambda secrets: credentials.split(secrets)[0],
    open=lambda concurrency: KafkaChannel(),
    target=lambda settings: f"topic {settings['topic']} on {', '.join(settings['bootstrap_servers'])}",
)
