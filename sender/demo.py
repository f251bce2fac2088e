"""``outbox demo``: a local receiver and mail server, a few intents, their delivery and honest outcomes.

Runs on a fresh machine with no configuration: everything lives in a temporary directory and
on loopback, and is gone when the demo ends.
"""

from __future__ import annotations

import asyncio
import email
import socket
import tempfile
from collections.abc import Callable
from email import policy
from pathlib import Path
from typing import Any

from aiohttp import web
from aiosmtpd.controller import Controller

from outbox import Outbox, Settings
from outbox.grants import GrantSpec
from receivers.wire import sign

from .email import EmailSpec
from .webhook import WebhookSpec, new_secret
from .worker import Worker


def _receiver(secret: str, log: Callable[[str], None]) -> web.Application:
    """A receiver that checks signatures; /flaky fails once, /gone is gone for good."""
    seen: dict[str, int] = {}

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        key = request.headers["webhook-id"]
        expected = sign((secret,), key, int(request.headers["webhook-timestamp"]), body)
        if request.headers["webhook-signature"] != expected:
            return web.json_response({"error": "bad signature"}, status=401)
        seen[key] = seen.get(key, 0) + 1
        log(f"  receiver: {request.path} {key} attempt {seen[key]} fence {request.headers['Outbox-Fence']}")
        if request.path == "/gone":
            return web.json_response({"error": "this endpoint was removed"}, status=410)
        if request.path == "/flaky" and seen[key] == 1:
            return web.json_response({"error": "warming up"}, status=503, headers={"Retry-After": "1"})
        return web.json_response({"ok": True}, headers={"External-Id": f"rcpt-{key}"})

    app = web.Application()
    app.router.add_post("/{path:.*}", handle)
    return app


class _MailServer:
    """aiosmtpd's handler: says what arrived and queues it under an id of its own."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.queued = 0

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.original_content or b"", policy=policy.default)
        self.queued += 1
        self.log(f"  mail server: {message['Message-ID']} from {envelope.mail_from} to "
                 f"{', '.join(envelope.rcpt_tos)}: {message['Subject']!r}")
        return f"250 2.0.0 Ok: queued as MAIL{self.queued}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def run_demo(echo: Callable[[str], None]) -> int:
    """Deliver five intents and print what happened to each; returns a process exit code."""
    secret = new_secret()
    mail = Controller(_MailServer(echo), hostname="127.0.0.1", port=_free_port())
    mail.start()
    runner = web.AppRunner(_receiver(secret, echo), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'demo.db'}",
                            backoff_initial_seconds=0.5, poll_seconds=0.2)
        async with await Outbox.open(settings=settings) as box:
            for name, path in (("orders", "/orders"), ("flaky", "/flaky"), ("gone", "/gone")):
                await box.put_destination(name, WebhookSpec(
                    url=f"http://127.0.0.1:{port}{path}", secret=secret, allow_private_network=True))
            await box.put_destination("mailroom", EmailSpec.model_validate({
                "channel": "email", "host": "127.0.0.1", "port": mail.port, "tls": "none", "allow_insecure": True,
                "allow_private_network": True, "from": "Demo Shop <shop@example.com>"}))
            await box.put_grant("demo", GrantSpec(scope="demo", destination="*", note="the demo"))
            echo(f"receiver on 127.0.0.1:{port}, mail server on 127.0.0.1:{mail.port}; "
                 "scope 'demo' is granted every destination")
            receipt = {"to": ["Ann <ann@example.org>"], "subject": "Your receipt", "text": "Thank you."}
            plans = [("order-1", "orders", "demo"), ("report-1", "flaky", "demo"),
                     ("legacy-1", "gone", "demo"), ("rogue-1", "orders", "intruder"),
                     ("receipt-1", "mailroom", "demo")]
            for action_id, destination, scope in plans:
                await box.enqueue(action_id=action_id, destination=destination, scope=scope,
                                  payload=receipt if destination == "mailroom" else {"demo": action_id})
                echo(f"enqueued {action_id} -> {destination} as {scope}")
            worker = Worker(box, concurrency=8)
            running = asyncio.create_task(worker.run())
            outcomes = [await box.wait(action_id, timeout=30) for action_id, _, _ in plans]
            worker.stop()
            await running
            echo("\noutcomes:")
            for intent in outcomes:
                history = await box.history(intent.action_id)
                last = history.attempts[-1] if history.attempts else None
                detail = (f"external id {last.external_id}" if last and last.external_id
                          else intent.last_error or "")
                echo(f"  {intent.action_id:<10} {intent.status.value:<9} attempts {intent.attempts}  {detail}")
    await runner.cleanup()
    mail.stop()
    expected = ["delivered", "delivered", "dead", "revoked", "delivered"]
    return 0 if [i.status.value for i in outcomes] == expected else 1
