"""The RabbitMQ channel: one persistent AMQP 0-9-1 message per intent, published with publisher
confirms and ``mandatory``.

What decides an outcome is whether the publish frame may have left. Until then nothing can
have reached the broker, and the attempt is ``not_submitted``: no connection (refused, TLS,
credentials), no channel, or the destination's exchange does not exist (checked by a passive
declare when the channel opens, since publishing to a missing exchange closes the channel).
Once published, only the broker's answer says what happened: a confirm (``basic.ack``:
delivered, every queue it was routed to has it, persisted for a durable queue), a ``basic.nack``
(refused, retryable), or ``basic.return`` before the confirm: no queue is bound for the routing
key, so the broker dropped the message. That is an answer, so ``submitted``, and ``rejected``:
publishing it again reaches no queue either until someone binds one, and calling it delivered
would say a consumer can read what no queue holds. No answer in the destination's timeout, or
the connection or channel closed with the message in flight, is ``maybe_submitted``: the broker
may have routed it. RabbitMQ has no publisher-side deduplication, so a resend after a lost
confirm is a second message with the same ``message_id`` (the idempotency key), which the
receivers' idempotent consumer recognises.

One connection and channel per destination (as its settings read now), shared by every send to
it and replaced once it closes; a worker's cycle publishes its messages at once (``send_many``)
and awaits their confirms as one wait, each message's result its own.

The SSRF guard: a destination without ``allow_private_network`` never opens a TCP connection to
an address the guard refuses: the broker's name is resolved and connected by ``sender.guard`` and
aiormq is handed that connection (``links``); TLS verifies the certificate against the URL's
host name. A refusal is ``not_submitted``, rejected.

The package: ``spec`` (the destination's settings and secrets), ``links`` (one connection and
channel per destination, through the guard) and ``channel`` (the publishing and its answers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from receivers import wire

from .. import credentials
from ..channel import ChannelModule
from .channel import RabbitChannel
from .spec import RabbitSpec, keep_secrets

__all__ = ["CHANNEL", "RabbitChannel", "RabbitSpec", "keep_secrets"]


def target(settings: Mapping[str, Any]) -> str:
    """Where a destination publishes, in words, for the console."""
    spec = RabbitSpec.model_construct(**settings)
    return (f"exchange {spec.exchange or 'amq.default'}, routing key {spec.routing_key!r} at {spec.host}:{spec.port}"
            f", vhost {spec.vhost}")


CHANNEL = ChannelModule(
    name="rabbitmq", spec=RabbitSpec, secret_form="a whsec_ secret to sign its messages", new_secret=wire.new_secret,
    keep_secrets=keep_secrets, signing=lambda secrets: credentials.split(secrets)[0],
    open=lambda concurrency: RabbitChannel(), target=target,
)
