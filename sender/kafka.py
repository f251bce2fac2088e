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
metadata do (``sender.kafka_connections``). A refused connection fails the attempt before the
record is handed to the producer: ``not_submitted``, rejected.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    BrokerResponseError,
    InvalidProducerEpoch,
    KafkaError,
    MessageSizeTooLargeError,
    NotEnoughReplicasAfterAppendError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RequestTimedOutError,
    UnknownProducerId,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import RecordMetadata, TopicPartition
from pydantic import ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator, model_validator

from outbox import Destination, DestinationSpec, Intent, OnUnknown, Outcome, Submission, hosts, tracing
from outbox.clock import Clock, SystemClock
from outbox.crash import crash_point
from outbox.destinations import rotate_secrets
from receivers import wire

from .channel import ChannelModule, ProbeAnswer, Send, SendResult
from .kafka_connections import GUARD, Guard

#: A topic name as Kafka allows it (``.`` and ``..`` are refused by the broker too).
TOPIC = re.compile(r"(?!\.{1,2}$)[A-Za-z0-9._-]{1,249}")
#: Broker errors that say the record was refused for good: it is too large, or the topic cannot be.
PERMANENT = frozenset(
    {"MessageSizeTooLargeError", "RecordListTooLargeError", "InvalidTopicError", "CorruptRecordException",
     "InvalidRecordError", "InvalidRequiredAcksError"})


#: Errors after which the broker refuses every record of this producer id: it lost the producer's
#: state or sequence (a crash, an expired id) or a newer producer fenced it (aiokafka reports an
#: ``InvalidProducerEpoch`` answer as ``ProducerFenced``). The producer is replaced.
ENDED = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch, ProducerFenced)


class KafkaSpec(DestinationSpec):
    """A Kafka destination: the cluster, the topic its records go to, and how they are produced."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["kafka"]
    bootstrap_servers: list[str] = Field(
        min_length=1, max_length=16, description="host:port of brokers to learn the cluster from")
    topic: str = Field(description="the topic every record of this destination is produced to")
    tls: StrictBool = Field(default=False, description="connect with TLS, verifying the brokers' certificates")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="authenticate with SASL as sasl_username with sasl_password")
    sasl_username: str | None = Field(default=None, min_length=1, max_length=256)
    sasl_password: str | None = Field(
        default=None, min_length=1, max_length=1024, exclude=True, repr=False, json_schema_extra={"writeOnly": True},
        description="write-only, kept with the destination's secrets (never shown). Omitted on update: the "
                    "current one stays")
    allow_insecure: StrictBool = Field(
        default=False, description="allow SASL without TLS (the password crosses the network in the clear)")
    enable_idempotence: StrictBool = Field(
        default=True, description="the idempotent producer: its own retries never append a record twice")
    acks: Literal["all", "leader"] = Field(
        default="all", description="all: every in-sync replica has the record before it counts as delivered")
    compression: Literal["none", "gzip"] = "none"
    linger_ms: StrictInt = Field(default=0, ge=0, le=1000, description="how long a batch may wait for more records")
    max_request_size: StrictInt = Field(default=1_048_576, ge=1024, le=64 * 1_048_576,
                                  description="the largest produce request; a larger record is rejected")
    on_unknown: OnUnknown = Field(
        default=OnUnknown.ALWAYS, description="consumers deduplicate (the receivers' idempotent consumer), so an "
                                              "unknown outcome is produced again, possibly as a second record")

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, servers: list[str]) -> list[str]:
        return [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                for host, port in (hosts.check_host_port(server) for server in servers)]

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str) -> str:
        if not TOPIC.fullmatch(topic):
            raise ValueError(f"topic {topic!r} is not a Kafka topic name (1-249 of A-Z a-z 0-9 . _ -, "
                             "not '.' or '..')")
        return topic

    @field_validator("secret")
    @classmethod
    def _whsec(cls, secret: str | None) -> str | None:
        """The records' signing secret, in a webhook's form (the SASL password has a field of its own)."""
        if secret is not None and not secret.startswith(wire.SECRET_PREFIX):
            raise ValueError(f"secret is the {wire.SECRET_PREFIX} signing secret of the records; give the SASL "
                             "password as sasl_password")
        return None if secret is None else wire.check_secret(secret)

    @field_validator("sasl_password")
    @classmethod
    def _password(cls, password: str | None) -> str | None:
        if password is not None and password.startswith(wire.SECRET_PREFIX):
            raise ValueError(f"sasl_password must not start with {wire.SECRET_PREFIX!r}, the signing secrets' form")
        return password

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSpec:
        if self.reconcile:
            raise ValueError("a Kafka broker cannot answer the reconcile probe; leave reconcile off")
        if self.enable_idempotence and self.acks != "all":
            raise ValueError("the idempotent producer needs acks: all")
        if (self.sasl_mechanism is None) != (self.sasl_username is None):
            raise ValueError("give sasl_mechanism and sasl_username together")
        if self.sasl_password is not None and self.sasl_mechanism is None:
            raise ValueError("sasl_password needs sasl_mechanism and sasl_username")
        if self.sasl_mechanism is not None and not self.tls and not self.allow_insecure:
            raise ValueError("SASL without tls sends the password in the clear; set tls, or allow_insecure")
        if not self.allow_private_network:
            for server in self.bootstrap_servers:
                address = hosts.ip_literal(server.rpartition(":")[0])
                if address is not None and not hosts.is_public(str(address)):
                    raise ValueError(f"bootstrap server {server} is not a public address (loopback, private, "
                                     "link-local or reserved): set allow_private_network to produce there")
        return self

    @property
    def security_protocol(self) -> str:
        return ("SASL_" if self.sasl_mechanism else "") + ("SSL" if self.tls else "PLAINTEXT")


class _Refused(Exception):
    """An attempt that ended before the record was handed to the producer: nothing was submitted."""

    def __init__(self, stage: str, outcome: Outcome, error: str) -> None:
        super().__init__(error)
        self.stage, self.outcome, self.error = stage, outcome, error

    def result(self) -> SendResult:
        return SendResult(Submission.NOT_SUBMITTED, self.outcome, error=self.error, stage=self.stage)


class _Place(NamedTuple):
    """Where a record goes: its topic, its partition (its leader takes connections) and its key."""

    topic: str
    partition: int
    key: bytes


@dataclass
class _Producer:
    """One destination's producer (as its settings read now), started by its first send."""

    spec: KafkaSpec
    version: datetime  # the destination's updated_at it was made for
    producer: AIOKafkaProducer | None = None
    #: The topic's partitions as last seen, sorted, and those with a leader.
    partitions: tuple[set[int] | None, list[int], list[int]] = (None, [], [])
    starting: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The SSRF guard of its connections; None when the destination allows the private network.
    guard: Guard | None = None
    #: The destination's secrets as last seen, and the signing secrets among them (split once).
    signing: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


class KafkaChannel:
    """Produces intents to Kafka destinations, one shared producer per destination."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None, clock: Clock | None = None) -> None:
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified
        self._clock = clock or SystemClock()  # what a record's webhook-timestamp says
        self._producers: dict[str, _Producer] = {}
        self._partitioner = DefaultPartitioner()

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self._produce(destination, [Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        """Hand every record to its destination's producer, then await the broker's answers to
        them all as one (one timer, not one per record): the producer packs them into its
        per-partition requests as it would concurrent sends."""
        groups: dict[tuple[str, datetime], list[int]] = {}
        for i, send in enumerate(sends):
            groups.setdefault((send.destination.id, send.destination.updated_at), []).append(i)
        if len(groups) == 1:
            return await self._produce(sends[0].destination, sends)
        produced = await asyncio.gather(*(self._produce(sends[places[0]].destination, [sends[i] for i in places])
                                          for places in groups.values()))
        results: list[SendResult | None] = [None] * len(sends)
        for places, answers in zip(groups.values(), produced, strict=True):
            for i, answer in zip(places, answers, strict=True):
                results[i] = answer
        return cast(list[SendResult], results)

    async def _produce(self, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        """The results of one destination's records, each in its place."""
        try:
            entry = await self._entry(destination)
        except ValidationError as exc:  # registered before today's rules: it can never be produced
            return [SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="connect",
                               error=f"refused: the destination's settings are not valid: {exc.errors()[0]['msg']}")
                    ] * len(sends)
        guarding = GUARD.set(entry.guard)
        try:
            return await self._produced(entry, destination, sends)
        finally:
            GUARD.reset(guarding)

    async def _produced(self, entry: _Producer, destination: Destination, sends: Sequence[Send]) -> list[SendResult]:
        try:
            producer = await self._started(entry, destination)
            places = await self._partitions(producer, entry, [_record_key(send.intent) for send in sends],
                                            destination)
        except _Refused as stop:
            return [stop.result()] * len(sends)
        if entry.signing[0] != destination.secrets:
            entry.signing = (destination.secrets, _split(destination.secrets)[0])
        signing = entry.signing[1]
        timestamp = int(self._clock.now().timestamp())
        results: list[SendResult | None] = [None] * len(sends)
        futures: dict[int, asyncio.Future[RecordMetadata]] = {}
        failed: SendResult | None = None  # the producer failed for good: no later record is handed to it
        for i, (send, place) in enumerate(zip(sends, places, strict=True)):
            if isinstance(place, _Refused):
                results[i] = place.result()
                continue
            if failed is not None:
                results[i] = failed
                continue
            value, headers = _record(send, signing, timestamp)
            try:
                futures[i] = await producer.send(place.topic, value, key=place.key, partition=place.partition,
                                                 headers=headers)
            except MessageSizeTooLargeError as exc:
                results[i] = SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, stage="produce",
                                        error=f"refused: the record is larger than max_request_size: {_describe(exc)}")
            except KafkaError as exc:  # the producer failed for good, before taking the record
                results[i] = failed = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, stage="produce",
                                                 error=_describe(exc))
        if futures:
            # From here a produce request carrying the records may leave: only the broker can say one did not.
            crash_point("after_request")
            await asyncio.wait(futures.values(), timeout=destination.timeout_seconds)
        ended = False
        for i, future in futures.items():
            results[i], lost = _answer(future, signing)
            ended |= lost
        if failed is not None or ended:
            await self._discard(entry, producer)
        return cast(list[SendResult], results)

    async def _entry(self, destination: Destination) -> _Producer:
        """The destination's producer entry; a change of the destination (its ``updated_at``)
        replaces it, stopping the old producer."""
        entry = self._producers.get(destination.id)
        if entry is None or entry.version != destination.updated_at:
            spec = KafkaSpec.model_validate({**destination.settings, "channel": "kafka",
                                             "allow_private_network": destination.allow_private_network})
            checking = None if destination.allow_private_network else Guard(destination.timeout_seconds)
            self._producers[destination.id] = fresh = _Producer(spec, destination.updated_at, guard=checking)
            if entry is not None:
                await self._discard(entry)  # (stopping flushes what it holds)
            entry = fresh
        return entry

    async def _started(self, entry: _Producer, destination: Destination) -> AIOKafkaProducer:
        """The entry's producer, started (bootstrapped) on first use. Raises _Refused."""
        if entry.producer is not None:
            return entry.producer
        async with entry.starting:
            if entry.producer is not None:
                return entry.producer
            spec = entry.spec
            _, password = _split(destination.secrets)
            if spec.sasl_mechanism is not None and password is None:
                raise _Refused("connect", Outcome.REJECTED, "the destination names a SASL user but holds no password")
            if entry.guard is not None:
                entry.guard.refused.clear()
            timeout_ms = int(destination.timeout_seconds * 1000)
            producer = AIOKafkaProducer(
                bootstrap_servers=spec.bootstrap_servers, client_id="outbox", acks="all" if spec.acks == "all" else 1,
                enable_idempotence=spec.enable_idempotence, compression_type=None if spec.compression == "none"
                else spec.compression, linger_ms=spec.linger_ms, max_request_size=spec.max_request_size,
                request_timeout_ms=timeout_ms, security_protocol=spec.security_protocol,
                ssl_context=self._context() if spec.tls else None, sasl_mechanism=spec.sasl_mechanism or "PLAIN",
                sasl_plain_username=spec.sasl_username,
                sasl_plain_password=password if spec.sasl_mechanism else None,
            )
            try:
                await asyncio.wait_for(producer.start(), destination.timeout_seconds)
            except (KafkaError, TimeoutError, OSError) as exc:
                await _stop(producer)
                await self._refused(entry)
                if isinstance(exc, BrokerResponseError) and not exc.retriable and spec.enable_idempotence:
                    # a broker answered, refusing a producer id for good: it lacks the idempotent producer
                    raise _Refused("connect", Outcome.REJECTED, "the broker refused the idempotent producer "
                                   f"({_describe(exc)}); set enable_idempotence: false to produce without it") from None
                if isinstance(exc, BrokerResponseError):
                    raise _Refused("connect", Outcome.RETRYABLE, f"the producer could not start: {_describe(exc)}") \
                        from None
                raise _Refused("connect", Outcome.RETRYABLE, f"no broker answered: {_describe(exc)}") from None
            entry.producer = producer
            return producer

    async def _partitions(self, producer: AIOKafkaProducer, entry: _Producer, keys: list[bytes],
                          destination: Destination) -> list[_Place | _Refused]:
        """Each record's partition, once the topic's metadata is known, or a _Refused for a record
        whose partition's leader does not take connections (so nothing of it can have left).
        Raises _Refused for all when the metadata does not come or the guard refused a broker."""
        topic = entry.spec.topic
        cluster = producer.client.cluster
        partitions = cluster.partitions_for_topic(topic)  # known: no need to ask (and to make a timer)
        if partitions is None:
            try:
                partitions = await asyncio.wait_for(producer.partitions_for(topic), destination.timeout_seconds)
            except (KafkaError, TimeoutError, OSError) as exc:
                await self._refused(entry)
                raise _Refused("metadata", Outcome.RETRYABLE,
                               f"no metadata for topic {topic}: {_describe(exc)}") from None
        if entry.partitions[0] != partitions:  # the partitioner's inputs, kept until the metadata changes
            entry.partitions = (partitions, sorted(partitions), list(cluster.available_partitions_for_topic(topic)))
        _, every, available = entry.partitions
        chosen = [self._partitioner(key, every, available) for key in keys]
        taking: dict[int, bool] = {}  # by partition: its leader takes connections
        for partition in chosen:
            if partition not in taking:
                leader = cluster.leader_for_partition(TopicPartition(topic, partition))
                taking[partition] = leader is not None and leader >= 0 and await producer.client.ready(leader)
        if not all(taking.values()):
            await self._refused(entry)
        return [_Place(topic, partition, key) if taking[partition] else _Refused(
                    "connect", Outcome.RETRYABLE, f"the leader of partition {partition} of {topic} does not take "
                    "connections") for key, partition in zip(keys, chosen, strict=True)]

    async def _refused(self, entry: _Producer) -> None:
        """Raise _Refused (rejected: the destination names a broker it may not reach) if the guard
        refused a connection of the entry's producer, stopping the producer, which would try it
        again and again."""
        if entry.guard is not None and entry.guard.refused:
            refused, entry.guard.refused = entry.guard.refused, {}
            await self._discard(entry)
            raise _Refused("connect", Outcome.REJECTED, "; ".join(sorted(set(refused.values()))))

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def _discard(self, entry: _Producer, producer: AIOKafkaProducer | None = None) -> None:
        """Stop the entry's producer, so the next send starts a new one; given ``producer``, only
        if that is still the entry's (concurrent sends that saw it fail replace it once)."""
        if entry.producer is None or (producer is not None and entry.producer is not producer):
            return
        stopping, entry.producer = entry.producer, None
        await _stop(stopping)

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="a Kafka broker cannot be asked whether a record was appended")

    async def aclose(self) -> None:
        entries, self._producers = list(self._producers.values()), {}
        for entry in entries:
            await self._discard(entry)


def _split(secrets: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """A Kafka destination's secrets as its signing secrets (newest first) and its SASL password:
    any secret not in the signing secrets' form (one stored before records were signed is such)."""
    signing = tuple(s for s in secrets if s.startswith(wire.SECRET_PREFIX))
    return signing, next((s for s in secrets if not s.startswith(wire.SECRET_PREFIX)), None)


def keep_secrets(held: tuple[str, ...], spec: KafkaSpec) -> tuple[str, ...]:
    """What a Kafka destination holds once ``spec`` replaces it: its signing secrets, rotated as
    a webhook's, then its SASL password, the one given or else the one held, while it uses SASL."""
    signing, password = _split(held)
    password = spec.sasl_password or password
    return rotate_secrets(signing, spec) + ((password,) if password is not None and spec.sasl_mechanism else ())


def _record_key(intent: Intent) -> bytes:
    """The record's key: the ordering key when the intent has one (a key's records stay in one
    partition, in order), else its action id."""
    return (intent.ordering_key or intent.action_id).encode()


def _record(send: Send, signing: tuple[str, ...], timestamp: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """A record's value and headers: its identity, its attempt's span, and its signature when
    the destination holds a signing secret."""
    intent = send.intent
    value = intent.payload_json.encode()
    headers = [(wire.KAFKA_IDEMPOTENCY_KEY, intent.key.encode()),
               (wire.KAFKA_PAYLOAD_DIGEST, intent.payload_digest.encode()),
               (wire.KAFKA_ATTEMPT_ID, send.attempt_id.encode()),
               (wire.KAFKA_FENCE, str(send.fence).encode()),
               *((name, value.encode()) for name, value in tracing.carrier(send.context).items())]
    if signing:
        headers += [(wire.KAFKA_TIMESTAMP, str(timestamp).encode()),
                    (wire.KAFKA_SIGNATURE, wire.sign(signing, intent.key, timestamp, value).encode())]
    return value, headers


def _answer(future: asyncio.Future[RecordMetadata], signing: tuple[str, ...]) -> tuple[SendResult, bool]:
    """What the broker answered for a record handed to the producer (no answer in time: the
    future is still pending, and cancelled), and whether it says the producer ended."""
    if not future.done() or future.cancelled():
        future.cancel()
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce",
                          error="no answer to the produce request: TimeoutError: the destination's timeout passed"), \
            False
    exc = future.exception()
    if isinstance(exc, ENDED):
        return _producer_ended(exc), True
    if isinstance(exc, BrokerResponseError):
        return _broker_refused(exc), False
    if exc is not None:  # a lost connection, or the producer stopped: the request may have gone
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce",
                          error=f"no answer to the produce request: {_describe(exc)}"), False
    sent = future.result()
    where = f"{sent.topic}/{sent.partition}/{sent.offset}"
    return SendResult(Submission.SUBMITTED, Outcome.DELIVERED, stage="done", answered=True, external_id=where,
                      reply=f"appended at {where}" + ("" if signing else ", unsigned: the destination holds no "
                                                      "signing secret")), False


def _broker_refused(exc: BrokerResponseError) -> SendResult:
    """The broker answered the produce request with an error."""
    if isinstance(exc, RequestTimedOutError | NotEnoughReplicasAfterAppendError):
        # appended to the leader (or may have been) without the replicas acknowledging it in time
        return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce", answered=True,
                          error=f"the broker may have appended the record: {_describe(exc)}")
    outcome = Outcome.REJECTED if type(exc).__name__ in PERMANENT else Outcome.RETRYABLE
    return SendResult(Submission.SUBMITTED, outcome, stage="produce", answered=True,
                      error=f"the broker did not append the record: {_describe(exc)}")


def _producer_ended(exc: KafkaError) -> SendResult:
    """The broker refused the record because it no longer knows the producer (``ENDED``)."""
    return SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, stage="produce", answered=True,
                      error=f"the broker no longer knows this producer ({_describe(exc)}): an earlier try of the "
                            "record, before the broker lost the producer's state, may have been appended; the "
                            "producer is replaced")


async def _stop(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), 5)
    except (KafkaError, TimeoutError, OSError):
        pass


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:500]


CHANNEL = ChannelModule(
    name="kafka", spec=KafkaSpec, secret_form="a whsec_ secret to sign its records", new_secret=wire.new_secret,
    keep_secrets=keep_secrets, signing=lambda secrets: _split(secrets)[0], open=lambda concurrency: KafkaChannel(),
    target=lambda settings: f"topic {settings['topic']} on {', '.join(settings['bootstrap_servers'])}",
)
