"""The Kafka channel's producers: one per destination (as its settings read now), started by its
first send, its connections through the SSRF guard, replaced when the destination changes or the
producer ends, and the partition each record goes to."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from aiokafka import AIOKafkaProducer
from aiokafka.errors import BrokerResponseError, KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import TopicPartition

from outbox import Destination, Outcome

from .. import credentials
from ..channel import describe
from .answers import Refused
from .connections import Guard
from .spec import KafkaSpec


class Place(NamedTuple):
    """Where a record goes: its topic, its partition (its leader takes connections) and its key."""

    topic: str
    partition: int
    key: bytes


@dataclass
class Producer:
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
    signing: tuple[tuple[str, ...], tuple[str, ...]] = field(default=((), ()), repr=False)


class Producers:
    """The producers of a channel's destinations, by destination id."""

    def __init__(self, *, tls_context: ssl.SSLContext | None = None) -> None:
        self._tls = tls_context  # None until first needed: the system's trusted CAs, verified
        self._producers: dict[str, Producer] = {}
        self._partitioner = DefaultPartitioner()

    async def entry(self, destination: Destination) -> Producer:
        """The destination's producer entry; a change of the destination (its ``updated_at``)
        replaces it, stopping the old producer."""
        entry = self._producers.get(destination.id)
        if entry is None or entry.version != destination.updated_at:
            spec = KafkaSpec.model_validate({**destination.settings, "channel": "kafka",
                                             "allow_private_network": destination.allow_private_network})
            checking = None if destination.allow_private_network else Guard(destination.timeout_seconds)
            self._producers[destination.id] = fresh = Producer(spec, destination.updated_at, guard=checking)
            if entry is not None:
                await self.discard(entry)  # (stopping flushes what it holds)
            entry = fresh
        return entry

    async def started(self, entry: Producer, destination: Destination) -> AIOKafkaProducer:
        """The entry's producer, started (bootstrapped) on first use. Raises Refused."""
        if entry.producer is not None:
            return entry.producer
        async with entry.starting:
            if entry.producer is not None:
                return entry.producer
            spec = entry.spec
            _, password = credentials.split(destination.secrets)
            if spec.sasl_mechanism is not None and password is None:
                raise Refused("connect", Outcome.REJECTED, "the destination names a SASL user but holds no password")
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
                await stop(producer)
                await self.refused(entry)
                if isinstance(exc, BrokerResponseError) and not exc.retriable and spec.enable_idempotence:
                    # a broker answered, refusing a producer id for good: it lacks the idempotent producer
                    raise Refused("connect", Outcome.REJECTED, "the broker refused the idempotent producer "
                                   f"({describe(exc)}); set enable_idempotence: false to produce without it") from None
                if isinstance(exc, BrokerResponseError):
                    raise Refused("connect", Outcome.RETRYABLE, f"the producer could not start: {describe(exc)}") \
                        from None
                raise Refused("connect", Outcome.RETRYABLE, f"no broker answered: {describe(exc)}") from None
            entry.producer = producer
            return producer

    async def partitions(self, producer: AIOKafkaProducer, entry: Producer, keys: list[bytes],
                          destination: Destination) -> list[Place | Refused]:
        """Each record's partition, once the topic's metadata is known, or a Refused for a record
        whose partition's leader does not take connections (so nothing of it can have left).
        Raises Refused for all when the metadata does not come or the guard refused a broker."""
        topic = entry.spec.topic
        cluster = producer.client.cluster
        partitions = cluster.partitions_for_topic(topic)  # known: no need to ask (and to make a timer)
        if partitions is None:
            try:
                partitions = await asyncio.wait_for(producer.partitions_for(topic), destination.timeout_seconds)
            except (KafkaError, TimeoutError, OSError) as exc:
                await self.refused(entry)
                raise Refused("metadata", Outcome.RETRYABLE,
                               f"no metadata for topic {topic}: {describe(exc)}") from None
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
            await self.refused(entry)
        return [Place(topic, partition, key) if taking[partition] else Refused(
                    "connect", Outcome.RETRYABLE, f"the leader of partition {partition} of {topic} does not take "
                    "connections") for key, partition in zip(keys, chosen, strict=True)]

    async def refused(self, entry: Producer) -> None:
        """Raise Refused (rejected: the destination names a broker it may not reach) if the guard
        refused a connection of the entry's producer, stopping the producer, which would try it
        again and again."""
        if entry.guard is not None and entry.guard.refused:
            refused, entry.guard.refused = entry.guard.refused, {}
            await self.discard(entry)
            raise Refused("connect", Outcome.REJECTED, "; ".join(sorted(set(refused.values()))))

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def discard(self, entry: Producer, producer: AIOKafkaProducer | None = None) -> None:
        """Stop the entry's producer, so the next send starts a new one; given ``producer``, only
        if that is still the entry's (concurrent sends that saw it fail replace it once)."""
        if entry.producer is None or (producer is not None and entry.producer is not producer):
            return
        stopping, entry.producer = entry.producer, None
        await stop(stopping)

    async def aclose(self) -> None:
        entries, self._producers = list(self._producers.values()), {}
        for entry in entries:
            await self.discard(entry)


async def stop(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), 5)
    except (KafkaError, TimeoutError, OSError):
        pass
