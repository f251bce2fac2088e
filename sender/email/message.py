"""The message as it is written to the server: its header fields (the outbox's identity headers
among them), the MIME body, and the Message-ID that is the same on every attempt."""

from __future__ import annotations

import re
from datetime import datetime
from email import policy
from email.header import Header
from email.message import Message
from email.mime.base import MIMEBase
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from email.utils import format_datetime

from opentelemetry.context import Context

from outbox import Intent, tracing
from receivers import wire

from .address import mailbox, written
from .destination import EmailSpec
from .payload import EmailPayload

#: How messages are written: CRLF, and header lines up to RFC 5322's limit, so an identity
#: header (a digest, a long key) is never folded. The message is built with the email package's
#: compat32 classes, which take header values as written: the newer EmailMessage API parses and
#: refolds every header, about 0.9 ms a message here, six times the whole build this way.
WIRE = policy.compat32.clone(linesep="\r\n", max_line_length=998)
#: Where SMTP sees a line end (str.splitlines also splits at form feeds and the like, which SMTP
#: does not).
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def message_id(key: str, sender: str) -> str:
    """``<key@domain-of-sender>``, the same on every attempt: the intent key as a dot-atom (each
    character outside it, and a dot that would end it or double it, as ``=XX``)."""
    left = re.sub(r"[^A-Za-z0-9!#$%&'*+/?^_`{|}~.-]|\.(?=\.|$)|^\.",
                  lambda m: f"={ord(m.group()):02X}", key)
    return f"<{left}@{mailbox(sender)[1].rpartition('@')[2]}>"


def compose(intent: Intent, spec: EmailSpec, payload: EmailPayload, *, attempt_id: str, fence: int,
            date: datetime, context: Context | None = None) -> bytes:
    """The whole message, ending in a line break (the final ``.`` of DATA needs a line of its own),
    carrying the trace of ``context``, the attempt's span (None: the current one)."""
    fields = [("From", spec.from_header), ("To", ", ".join(map(written, payload.to)))]
    if payload.cc:
        fields.append(("Cc", ", ".join(map(written, payload.cc))))
    if spec.reply_to:
        fields.append(("Reply-To", written(spec.reply_to)))
    fields += [("Subject", payload.subject), ("Date", format_datetime(date)),
               ("Message-ID", message_id(intent.key, spec.from_)), (wire.IDEMPOTENCY_KEY, intent.key),
               (wire.PAYLOAD_DIGEST, intent.payload_digest), (wire.ATTEMPT_ID, attempt_id),
               (wire.FENCE, str(fence)), *tracing.carrier(context).items(),
               *{**spec.headers, **payload.headers}.items()]
    body = _single(payload)
    whole = b"".join(_field(name, value) for name, value in fields) + (
        _body(payload).as_bytes(policy=WIRE) if body is None else body)
    return whole if whole.endswith(b"\r\n") else whole + b"\r\n"


def _field(name: str, value: str) -> bytes:
    """One header line as the message holds it: ASCII that fits a line as it is (as the email
    package would write it, without its folding machinery, most of a message's build), anything
    else RFC 2047-encoded or folded by the email package."""
    if value.isascii() and len(name) + len(value) <= 996:  # "name: value" within 998 characters
        return f"{name}: {value}\r\n".encode("ascii")
    return WIRE.fold_binary(name, value if value.isascii() else Header(value, "utf-8", maxlinelen=998))  # type: ignore[arg-type]


def _plain(text: str) -> bool:
    """Whether a body is ASCII in lines SMTP carries as they are (sent 7bit, else UTF-8 in base64)."""
    return text.isascii() and all(len(line) <= 998 for line in LINE_BREAK.split(text))


def _part(text: str, subtype: str) -> MIMEText:
    """One body, 7bit when it is plain, else UTF-8 in base64."""
    return MIMEText(text, subtype, "us-ascii" if _plain(text) else "utf-8")


def _single(payload: EmailPayload) -> bytes | None:
    """The MIME part of a message that is one plain body (text or html, no attachments), written
    as ``_body`` and the email package write it (a test holds the two equal) without building
    its MIME objects, which took most of such a message's build; None for any other message."""
    bodies = [(body, subtype) for body, subtype in ((payload.text, "plain"), (payload.html, "html"))
              if body is not None]
    if len(bodies) != 1 or payload.attachments or not _plain(bodies[0][0]):
        return None
    text, subtype = bodies[0]
    return (f'Content-Type: text/{subtype}; charset="us-ascii"\r\nMIME-Version: 1.0\r\n'
            "Content-Transfer-Encoding: 7bit\r\n\r\n" + "\r\n".join(LINE_BREAK.split(text))).encode("ascii")


def _body(payload: EmailPayload) -> Message:
    """The MIME tree: text or html, both as multipart/alternative, attachments beside it in
    multipart/mixed (their base64 is sent as given, in 76-character lines)."""
    parts = [_part(body, subtype) for body, subtype in ((payload.text, "plain"), (payload.html, "html"))
             if body is not None]
    body: Message = parts[0] if len(parts) == 1 else MIMEMultipart("alternative", _subparts=parts)
    if not payload.attachments:
        return body
    files: list[Message] = []
    for attachment in payload.attachments:
        file = MIMEBase(*attachment.content_type.split("/", 1))
        file.set_payload("\r\n".join(attachment.content[i:i + 76] for i in range(0, len(attachment.content), 76)))
        file["Content-Transfer-Encoding"] = "base64"
        name = attachment.filename
        file.add_header("Content-Disposition", "attachment", filename=name if name.isascii() else ("utf-8", "", name))
        files.append(file)
    return MIMEMultipart("mixed", _subparts=[body, *files])
