"""The Redis Streams channel: one stream entry per intent, added by a short Lua script that makes
a resend harmless on the server.

The script (``channel.SCRIPT``) looks up the intent's dedupe key (its idempotency key, hash-tagged
with the stream's name so both keys share a cluster slot); found, it answers the entry added
earlier and adds nothing; else it XADDs the entry (trimmed with ``MAXLEN ~`` when the destination
sets ``max_len``) and records the entry's id under the dedupe key for ``dedupe_ttl_seconds``. It
runs atomically, so an attempt whose reply was lost and the retry after it leave one entry,
within the TTL. The entry id is the attempt's ``external_id``. Its fields are the envelope's
(``sender.envelope``: identity, attempt, fence, trace, signature) and ``payload``.

What decides an outcome is whether the script call may have been written. A failure before that
(connect, TLS, AUTH, SELECT, the SSRF guard) is ``not_submitted``. An error reply says the script
added nothing: ``submitted``, retryable when the server may take it later (out of memory, a
read-only replica, loading, busy), else rejected (a key of another type, no permission);
``NOSCRIPT`` (the server's script cache was emptied) is answered by sending the script itself.
No reply within the destination's timeout, or the connection lost after the write, is
``maybe_submitted``. With ``wait_replicas`` the pipeline ends with ``WAIT``: fewer replicas than
asked is ``submitted``/retryable, since the entry is on the primary and the retry is answered
with the same entry.

One pool of connections per destination (as its settings and secrets read now), opened through
the SSRF guard (``connections``). A worker's cycle hands over its entries at once (``send_many``):
one pipeline of script calls per destination, one round trip, each reply its own result.

The package: ``spec`` (the destination's settings and secrets), ``connections`` (the pools, and
their connections through the SSRF guard) and ``channel`` (the sending, and what a reply means).
"""

from __future__ import annotations

from receivers import wire

from .. import credentials
from ..channel import ChannelModule
from .channel import RedisChannel, dedupe_key
from .spec import RedisSpec, keep_secrets

__all__ = ["CHANNEL", "RedisChannel", "RedisSpec", "dedupe_key", "keep_secrets"]

CHANNEL = ChannelModule(
    name="redis", spec=RedisSpec, secret_form="a whsec_ secret to sign its entries", new_secret=wire.new_secret,
    keep_secrets=keep_secrets, signing=lambda secrets: credentials.split(secrets)[0],
    open=lambda concurrency: RedisChannel(),
    target=lambda settings: f"stream {settings['stream']} on {settings['host']}:{settings.get('port', 6379)}"
                            f"/{settings.get('db', 0)}",
)
