"""Prometheus metrics: the backlog read from the store at scrape time, and what this process's
sender did (attempts, latency, lease expiries, authority denials) counted as it happens."""

from __future__ import annotations

from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from . import channels
from .destinations import Destination
from .model import Status
from .store import Store

#: The ``destination`` label of every tenant's own destination: they are counted together, so the
#: label's values stay the shared destinations an admin registers, however many tenants make theirs.
TENANT_LABEL = "tenant"


def destination_label(destination: Destination) -> str:
    """A destination's ``destination`` label: its id if shared, TENANT_LABEL if a tenant owns it."""
    return TENANT_LABEL if destination.owner is not None else destination.id

#: Enqueue-to-delivered latency buckets, from instant to the retry schedule's hours.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)


class Metrics:
    """One registry per outbox, so several outboxes in one process never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.intents = Gauge("outbox_intents", "Intents by status and channel.", ["status", "channel"], registry=r)
        self.oldest_due_age = Gauge("outbox_oldest_due_age_seconds",
                                    "How long the oldest due intent has been waiting to be sent.", registry=r)
        self.attempts = Counter("outbox_attempts_total",
                                "Attempts finished, by destination (every tenant's own: 'tenant') and outcome.",
                                ["destination", "outcome"], registry=r)
        self.latency = Histogram("outbox_delivery_latency_seconds", "From enqueue to delivered.",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.dead_lettered = Counter("outbox_dead_lettered_total", "Intents dead-lettered.", registry=r)
        self.unknown = Counter("outbox_unknown_outcomes_total", "Intents left with an unknown outcome.", registry=r)
        self.lease_expiries = Counter("outbox_lease_expiries_total", "Leases recovered by the sweeper.", registry=r)
        self.authority_denials = Counter("outbox_authority_denials_total", "Sends refused by the authority.",
                                         registry=r)
        self.paused_destinations = Gauge("outbox_paused_destinations",
                                         "Destinations this process's sender has paused: they stopped answering.",
                                         registry=r)
        self.sends_held = Counter(
            "outbox_sends_held", "Due intents a claim of this process's sender held back by a destination's limit "
            "(rate, in_flight) or pause, counted at each claim that passed them over.", ["destination", "limit"],
            registry=r)
        self.events_published = Counter("outbox_events_published_total",
                                        "Events recorded by publishing (not counting repeats of one).", registry=r)
        self.intents_fanned_out = Counter("outbox_intents_fanned_out_total",
                                          "Intents made by events' fan-outs and operators' deliveries of events.",
                                          registry=r)
        self.fanout_refused = Counter("outbox_fanout_refused_total",
                                      "Events refused, nothing recorded, because they would fan out to more "
                                      "destinations than max_fanout (OUTBOX_MAX_FANOUT) allows.", registry=r)

    def published(self, created: int, intents: int, refused: int = 0) -> None:
        """Count ``created`` events recorded, ``intents`` intents they (or a delivery) made, and
        ``refused`` events refused for their fan-out."""
        if created:
            self.events_published.inc(created)
        if intents:
            self.intents_fanned_out.inc(intents)
        if refused:
            self.fanout_refused.inc(refused)

    async def render(self, store: Store, now: datetime) -> bytes:
        """Refresh the backlog gauges from the store, then the exposition text."""
        counts = {(status, channel): n for status, channel, n in await store.count_by_status()}
        # every installed channel (and any still named by stored intents) has its zeros
        for channel in sorted({*channels.names(), *(channel for _, channel in counts)}):
            for status in Status:
                self.intents.labels(status.value, channel).set(counts.get((status.value, channel), 0))
        oldest = await store.oldest_due_at(now)
        self.oldest_due_age.set(0 if oldest is None else max(0.0, (now - oldest).total_seconds()))
        return generate_latest(self.registry)
