"""The SQS channel: one message per intent on a standard or FIFO queue (Amazon SQS, or an API
that speaks its protocol: ElasticMQ, LocalStack), sent with ``SendMessageBatch``.

The message's body is the payload's canonical JSON (``envelope.payload``) and its attributes, all
of type String, are what every broker message of the outbox carries (``envelope.headers``:
``idempotency-key``, ``payload-digest``, ``outbox-attempt-id``, ``outbox-fence``, the trace, and
``webhook-timestamp``/``webhook-signature`` when the destination holds a ``whsec_`` secret). On a
FIFO queue ``MessageDeduplicationId`` is the sha256 hex of the idempotency key, so SQS drops a
resend of the intent within its five-minute window, and ``MessageGroupId`` is the ordering key,
else the action id.

What decides an outcome is whether a request carrying the message may have been written. Refused
here (no key, a message SQS could never take, the SSRF guard) or a connection never made (refused,
a connect timeout, a failed TLS handshake): ``not_submitted``. SQS's answer is the evidence: a
message in the answer's ``Successful`` list is delivered, its ``MessageId`` the external id; an
error answer or an entry in ``Failed`` is ``submitted`` and nothing was enqueued: retryable for
throttling, a 5xx and an entry SQS does not blame on the sender, rejected otherwise
(``answers.RETRYABLE`` lists the codes). No answer in the destination's timeout, or a connection
lost after the request left: ``maybe_submitted``, unknown.

One client per destination (as its settings read now), replaced when the destination changes or
a request on it gets no answer (the connection failed); a replaced client is closed once the
requests under way on it have their answers, so replacing it cuts none short.

botocore's own retries are off: each attempt is one request, so an attempt's record says what
that request did, and retrying is the outbox's (its backoff, its ``on_unknown``). The default
``on_unknown`` is ``always``: on a FIFO queue a resend within five minutes is dropped by SQS; a
later one (after a long backoff), or any on a standard queue (which may deliver any message twice
anyway), can be a second message, which the consumer drops by its ``idempotency-key``.

The SSRF guard: without ``allow_private_network`` the client's connections go through the webhook
channel's resolver and socket factory (aiohttp's, under aiobotocore), so the address connected to
is a public one, whatever the endpoint's name resolves to; TLS still verifies the certificate
against that name. botocore would take a proxy from the environment (HTTP(S)_PROXY); the channel
takes none, since a proxy would connect to the endpoint itself, past the guard. Nor does it follow
a redirect (aiohttp would: the signed request re-sent to wherever a 3xx points, that server's answer
taken for SQS's): a 3xx is the endpoint's error answer, ``submitted`` and rejected. The guard's
refusal is ``not_submitted``, rejected.

The package: ``spec`` (the destination's settings, its key and the enqueue check), ``channel``
(one client per destination, the batches) and ``answers`` (what a request came to).
"""

from __future__ import annotations

from receivers import wire

from .. import credentials
from ..channel import ChannelModule
from .channel import SqsChannel
from .spec import SqsSpec, check_payload, keep_secrets

__all__ = ["CHANNEL", "SqsChannel", "SqsSpec", "check_payload", "keep_secrets"]

CHANNEL = ChannelModule(
    name="sqs", spec=SqsSpec, secret_form="a whsec_ secret to sign its messages", new_secret=wire.new_secret,
    keep_secrets=keep_secrets, signing=lambda secrets: credentials.split(secrets)[0], check_payload=check_payload,
    open=lambda concurrency: SqsChannel(concurrency=concurrency),
    target=lambda settings: f"queue {SqsSpec.model_construct(**settings).url}",
)
