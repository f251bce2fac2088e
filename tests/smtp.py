"""A scriptable SMTP server for the email channel's tests: aiosmtpd on 127.0.0.1, in a thread.

    server = SmtpServer(tls="starttls", auth=("mailer", "pw")).start()
    server.mail["billing@example.com"] = "451 4.3.2 try later"  # answer MAIL FROM for one sender
    server.rcpt["gone@example.org"] = "550 5.1.1 no such user"   # answer RCPT TO for one address
                                                                 # ("close": drop the connection instead)
    server.data_command = "451 4.3.0 try later"                 # answer the DATA command itself
    server.after_data = "hold"                                   # or "close", or a reply such as "452 ..."
    server.replies = ["250 Ok"]                                  # answers for the next messages, then after_data
    server.received                                              # every message whose final "." arrived
    server.stop()

``received`` records what really arrived, also when the server then drops the connection or
never answers, so a test can hold the stored attempt against it. ``tls`` is ``starttls``
(required before MAIL), ``implicit`` or ``none``; certificates come from a throwaway trustme CA,
whose ``client_context()`` the channel under test is given.
"""

from __future__ import annotations

import asyncio
import email
import threading
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from typing import Any, Literal

import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.conftest import free_port

CA = trustme.CA()
CERT = CA.issue_cert("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Received:
    """One message as the server got it: its envelope, and its content parsed."""

    sender: str
    recipients: list[str]
    content: bytes

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.content, policy=policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class SmtpServer:
    """The server, its script and its record."""

    tls: Literal["starttls", "implicit", "none"] = "none"
    auth: tuple[str, str] | None = None
    mail: dict[str, str] = field(default_factory=dict)  # envelope sender -> reply; others get 250
    rcpt: dict[str, str] = field(default_factory=dict)  # address -> reply; others get 250
    data_command: str | None = None  # a reply refusing the DATA command; None: 354
    after_data: str = "250 2.0.0 Ok: queued as Q{n}"  # or "close" (drop unanswered), "hold" (never answer)
    replies: list[str] = field(default_factory=list)  # taken first, one per message, before after_data
    data_delay: float = 0.0  # seconds the reply to the end of a message waits (a server scanning it)
    received: list[Received] = field(default_factory=list)
    sessions: int = 0  # connections that said EHLO or HELO
    port: int = 0
    _controller: Controller | None = None
    _released: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def client_context() -> Any:
        """An ssl.SSLContext that trusts this module's CA (verification on)."""
        import ssl

        context = ssl.create_default_context()
        CA.configure_trust(context)
        return context

    def start(self) -> SmtpServer:
        import ssl

        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        CERT.configure_cert(server_context)
        self.port = free_port()
        options: dict[str, Any] = {}
        if self.tls == "starttls":
            options.update(tls_context=server_context, require_starttls=True)
        if self.auth is not None:
            options.update(authenticator=self._authenticate, auth_required=True,
                           auth_require_tls=self.tls != "none")
        owner = self

        class Scripted(Controller):
            def factory(self) -> SMTP:
                return _ScriptedSMTP(owner, self.handler, **self.SMTP_kwargs)

        self._controller = Scripted(
            _Handler(self), hostname="127.0.0.1", port=self.port,
            ssl_context=server_context if self.tls == "implicit" else None, **options)
        self._controller.start()
        return self

    def stop(self) -> None:
        self._released.set()
        if self._controller is not None:
            self._controller.stop()

    def _authenticate(self, server: SMTP, session: Session, envelope: Envelope, mechanism: str,
                      auth_data: Any) -> AuthResult:
        assert self.auth is not None
        ok = isinstance(auth_data, LoginPassword) and (
            auth_data.login.decode(), auth_data.password.decode()) == self.auth
        return AuthResult(success=ok, handled=False)  # a refusal is answered 535


class _ScriptedSMTP(SMTP):
    """aiosmtpd's server, but the DATA command can be refused."""

    def __init__(self, owner: SmtpServer, handler: Any, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._owner = owner

    async def smtp_DATA(self, arg: str) -> None:
        if self._owner.data_command is not None and self.envelope is not None and self.envelope.rcpt_tos:
            await self.push(self._owner.data_command)
            return
        await super().smtp_DATA(arg)

    async def smtp_EHLO(self, hostname: str) -> None:
        self._owner.sessions += 1
        await super().smtp_EHLO(hostname)


class _Handler:
    def __init__(self, owner: SmtpServer) -> None:
        self.owner = owner

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          options: list[str]) -> str:
        reply = self.owner.mail.get(address)
        if reply is None:
            envelope.mail_from = address
            envelope.mail_options.extend(options)
            return "250 OK"
        return _dropped(server) if reply == "close" else reply

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope, address: str,
                          options: list[str]) -> str:
        reply = self.owner.rcpt.get(address)
        if reply is None:
            envelope.rcpt_tos.append(address)
            return "250 OK"
        return _dropped(server) if reply == "close" else reply

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        self.owner.received.append(Received(envelope.mail_from or "", list(envelope.rcpt_tos), content))
        after = self.owner.replies.pop(0) if self.owner.replies else self.owner.after_data
        if after == "close":
            return _dropped(server)  # the final "." arrived; no reply ever leaves
        if self.owner.data_delay:
            await asyncio.sleep(self.owner.data_delay)
        if after == "hold":
            await asyncio.get_running_loop().run_in_executor(None, self.owner._released.wait, 60)
            return "421 4.3.0 gave up"
        return after.format(n=len(self.owner.received))


def _dropped(server: SMTP) -> str:
    """Drop the connection instead of answering the command (the returned reply never leaves)."""
    assert isinstance(server.transport, asyncio.Transport)
    server.transport.abort()
    return "250 never sent"
