"""A connection to a destination's SMTP server, through greeting, TLS, EHLO and AUTH.

The socket is connected by ``sender.guard``, to an address the SSRF guard allowed, and handed to
aiosmtplib with the host's name for TLS verification. Whatever ends an attempt before the
message is written is a ``Refused``: nothing was submitted.
"""

from __future__ import annotations

import ssl

import aiosmtplib

from outbox import Destination, Outcome

from .. import guard
from ..channel import REPLY_BYTES
from .destination import EmailSpec


class Refused(Exception):
    """An attempt that ended before the message was written: nothing was submitted."""

    def __init__(self, stage: str, outcome: Outcome, error: str, code: int | None = None,
                 reply: str | None = None) -> None:
        super().__init__(error)
        self.stage, self.outcome, self.error, self.code, self.reply = stage, outcome, error, code, reply


def by_code(code: int) -> Outcome:
    """A reply refusing a command: 4xx is worth trying again, 5xx is permanent."""
    return Outcome.RETRYABLE if 400 <= code < 500 else Outcome.REJECTED


def describe(exc: BaseException) -> str:
    """An error as an attempt records it: its type and text, bounded."""
    return f"{type(exc).__name__}: {exc}"[:500]


async def connect(spec: EmailSpec, destination: Destination, context: ssl.SSLContext | None) -> aiosmtplib.SMTP:
    """A connection through greeting, TLS (verified with ``context``), EHLO and AUTH. Raises Refused."""
    timeout = destination.timeout_seconds
    stage = "connect"
    try:
        sock = await guard.connect(spec.host, spec.port, allow_private=destination.allow_private_network,
                                   timeout=timeout)
    except guard.PrivateAddressRefused as exc:
        raise Refused(stage, Outcome.REJECTED, exc.explain()) from None
    except OSError as exc:
        raise Refused(stage, Outcome.RETRYABLE, describe(exc)) from None
    client = aiosmtplib.SMTP(hostname=spec.host, sock=sock, timeout=timeout,
                             use_tls=spec.tls == "implicit", start_tls=False, tls_context=context)
    try:
        stage = "tls" if spec.tls == "implicit" else "connect"
        await client.connect()
        stage = "ehlo"
        await client.ehlo()
        if spec.tls == "starttls":
            stage = "tls"
            if not client.supports_extension("starttls"):
                raise Refused(stage, Outcome.REJECTED, "the server does not offer STARTTLS, which this "
                              "destination requires (tls: starttls)")
            await client.starttls(tls_context=context)
            stage = "ehlo"
            await client.ehlo()
        if spec.username is not None:
            stage = "auth"
            if not destination.secrets:
                raise Refused(stage, Outcome.REJECTED, "the destination names a username but holds no password")
            await client.login(spec.username, destination.secrets[0])
        return client
    except Refused:
        client.close()
        raise
    except aiosmtplib.SMTPResponseException as exc:
        client.close()
        raise Refused(stage, by_code(exc.code), f"{stage} refused: {exc.code} {exc.message}", exc.code,
                      f"{exc.code} {exc.message}"[:REPLY_BYTES]) from None
    except (aiosmtplib.SMTPException, OSError) as exc:
        client.close()
        raise Refused(stage, Outcome.RETRYABLE, describe(exc)) from None
