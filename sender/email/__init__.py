"""The email channel: one message per intent over SMTP, classified by the stage it reached
(``channel`` says how), through connections that ``sender.guard`` connects and that are reused
per destination.

- ``address``: an address as given (``Name <a@example.com>``), read by the email package's parser
- ``headers``: the header fields a payload or a destination may add
- ``payload``: what an intent carries, checked at enqueue
- ``destination``: an email destination's settings (``EmailSpec``)
- ``message``: the message as written (header fields, MIME body, Message-ID)
- ``connection``: a connection through greeting, TLS, EHLO and AUTH
- ``pool``: connections kept for reuse, per destination
- ``channel``: the sends (``EmailChannel``)
"""

from __future__ import annotations

from ..channel import ChannelModule
from .address import Mailbox, mailbox
from .channel import EmailChannel
from .destination import EmailSpec
from .message import message_id
from .payload import Attachment, EmailPayload, check_payload

__all__ = ["CHANNEL", "Attachment", "EmailChannel", "EmailPayload", "EmailSpec", "Mailbox", "check_payload",
           "mailbox", "message_id"]

CHANNEL = ChannelModule(
    name="email", spec=EmailSpec, needs_secret=False, check_payload=check_payload,
    signing=lambda secrets: (),  # its one secret is the AUTH password: a message is not signed
    open=lambda concurrency: EmailChannel(), target=lambda settings: f"smtp {settings['host']}:{settings['port']}",
)
