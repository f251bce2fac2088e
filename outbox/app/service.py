"""The service as ``outbox serve`` runs it: the HTTP API (``outbox.api``) composed with the
sender, which builds on the outbox. Operators' replays ask the configured authority provider
(``sender.authority.authorizer``) and, with ``settings.worker``, a sender runs in the same
process and event loop as the API, on its outbox.

Serve it under your own ASGI server as ``outbox.service:create_service`` (a factory); call
``outbox.api.begin_shutdown(app)`` from the server's exit handler, as ``outbox serve`` does, and
give the server what ``listening`` gives uvicorn: whether it speaks TLS and which proxies it
believes about the scheme, since the console's cookies are ``Secure`` by the scheme it reports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from sender import Worker
from sender.authority import authorizer

from ..outbox import Outbox
from ..settings import Settings
from .api import create_app
from .routes.probes import ended_by

log = logging.getLogger("outbox.api")


def create_service(settings: Settings | None = None, *, outbox: Outbox | None = None,
                   probes_only: bool = False) -> FastAPI:
    """The API application with the configured authority check and, when ``settings.worker``,
    an embedded sender; arguments as for ``outbox.api.create_app``. ``outbox serve`` serves
    it, and ``outbox worker --metrics-port`` its probes (with ``worker`` set)."""
    settings = settings or (outbox.settings if outbox else Settings())
    return create_app(settings, outbox=outbox, probes_only=probes_only, authorizer=authorizer,
                      companions=[embedded_sender] if settings.worker else [])


def listening(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for how ``outbox serve`` takes connections: HTTPS with the certificate
    and key files when ``tls_certfile`` is set, and the ``X-Forwarded-Proto``/``-For`` of the
    peers ``forwarded_allow_ips`` names, only with ``proxy_headers`` (uvicorn's own default would
    trust loopback, or ``$FORWARDED_ALLOW_IPS``, whatever the settings say)."""
    options: dict[str, Any] = {"proxy_headers": settings.proxy_headers,
                               "forwarded_allow_ips": settings.forwarded_allow_ips}
    if settings.tls_certfile is not None:
        options |= {"ssl_certfile": str(settings.tls_certfile),
                    "ssl_keyfile": None if settings.tls_keyfile is None else str(settings.tls_keyfile)}
    return options


@asynccontextmanager
async def embedded_sender(app: FastAPI, box: Outbox) -> AsyncIterator[None]:
    """A sender on the app's outbox while the app serves: ``begin_shutdown`` stops its claiming,
    ``/healthz`` fails if it stops by itself, and at shutdown it drains before the outbox closes."""
    worker = app.state.worker = Worker(box)
    task = app.state.worker_task = asyncio.create_task(worker.run())
    task.add_done_callback(_sender_ended)
    try:
        yield
    finally:
        worker.stop()
        await task


def _sender_ended(task: asyncio.Task[None]) -> None:
    """Say at once, not at shutdown, that the embedded sender is gone (``/healthz`` says so too)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("the embedded sender stopped: %s; nothing is being delivered", ended_by(task),
                     exc_info=task.exception())
