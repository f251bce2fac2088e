"""The NATS JetStream channel: one message per intent, published to a subject a stream stores.

What decides an outcome is whether the message may have reached the server, and what JetStream
answered. Until the publish is written nothing can have been stored, and the attempt is
``not_submitted``: no server took the connection (refused, TLS, the credentials refused, the SSRF
guard), or the message is larger than the server's ``max_payload``. Once published, only the
PubAck says what happened: stored (delivered, its ``stream/seq`` the external id), or an error
saying it was not stored: no responders (no stream takes the subject: retried, since a stream may
be made for it, and dead once the attempts run out) or JetStream's refusal (a 4xx, such as another
stream than ``expected_stream``: rejected; a 5xx: retried). No PubAck within the destination's
timeout, or the connection closed before it came, is ``maybe_submitted`` (and the connection is
replaced: one that hears nothing may be dead without knowing it).

Every message carries ``Nats-Msg-Id`` = the idempotency key, so a resend within the stream's
duplicate window (``duplicate_window``, 2 minutes by default) is dropped by JetStream itself, which
answers ``duplicate: true`` with the first message's sequence: evidence an earlier attempt landed,
recorded as delivered, saying so. A resend after the window is a second message, which the
receivers' idempotent consumer recognises by its ``idempotency-key`` header; hence the default
``on_unknown: always``.

Each message is signed as a webhook is (``sender.envelope``), its metadata in NATS headers.

The package: ``spec`` (the destination's settings and secrets), ``connections`` (one connection
per destination, through the SSRF guard) and ``channel`` (the sending and what each PubAck means).
"""

from __future__ import annotations

from receivers import wire

from .. import credentials
from ..channel import ChannelModule
from .channel import NatsChannel
from .spec import NatsSpec, keep_secrets

__all__ = ["CHANNEL", "NatsChannel", "NatsSpec", "keep_secrets"]

CHANNEL = ChannelModule(
    name="nats", spec=NatsSpec, secret_form="a whsec_ secret to sign its messages", new_secret=wire.new_secret,
    keep_secrets=keep_secrets, signing=lambda secrets: credentials.split(secrets)[0],
    open=lambda concurrency: NatsChannel(),
    target=lambda settings: f"subject {settings['subject']} on {', '.join(settings['servers'])}",
)
