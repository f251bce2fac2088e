"""The private postfix of tests/mta.py starts, accepts a message over SMTP and relays it to a sink."""

from __future__ import annotations

import email.parser
import email.policy
import os
import queue
import smtplib
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from ..mta import Postfix, free_port, postfix_available


class Sink:
    """An aiosmtpd handler that keeps each message's raw content."""

    def __init__(self) -> None:
        self.received: queue.Queue[bytes] = queue.Queue()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received.put(envelope.content)
        return "250 OK"


def require_postfix() -> None:
    if postfix_available() and os.geteuid() == 0:
        return
    reason = (
        "Debian's postfix is not installed (/usr/sbin/postfix; .ci/run installs it)"
        if not postfix_available()
        else "a private postfix must be started as root"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def test_private_postfix_relays_a_message_to_the_sink() -> None:
    require_postfix()
    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        with Postfix("127.0.0.1", controller.port) as mta:
            message = EmailMessage()
            message["From"] = "a@example.com"
            message["To"] = "b@example.org"
            message["Subject"] = "relayed"
            message["Message-ID"] = "<mta-test-1@example.com>"
            message.set_content("Hello through a real MTA.\n")
            with smtplib.SMTP(mta.host, mta.port, timeout=10) as client:
                refused = client.send_message(message, "a@example.com", ["b@example.org"])
            assert refused == {}
            try:
                raw = sink.received.get(timeout=20)
            except queue.Empty:
                pytest.fail(f"the sink received nothing within 20 s; postfix's log:\n{mta.maillog()}")
    finally:
        controller.stop()

    received = email.parser.BytesParser(policy=email.policy.default).parsebytes(raw)
    assert received["Message-ID"] == "<mta-test-1@example.com>"
    assert received["From"] == "a@example.com"
    assert received["To"] == "b@example.org"
    assert "by mta.test (Postfix)" in received["Received"]
    body = received.get_body()
    assert body is not None
    assert body.get_content().splitlines() == ["Hello through a real MTA."]  # CRLF on the wire
    assert sink.received.empty()
