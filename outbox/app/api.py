"""The HTTP API (``/v1``): producers enqueue and read, operators act on intents, admins manage
destinations, grants and tokens, tenants their own destinations and deliveries (``/v1/tenant``);
plus probes, metrics and the console.

Every error is RFC 9457 problem+json, and a refused request changes nothing in the store.

:func:`create_app` assembles the routers of ``outbox.routes`` (one per noun) and the console.
It knows nothing of the sender: whoever composes the service hands in the authority check for
operators' replays and what runs beside the API, such as an embedded sender
(``outbox.service.create_service``, which ``outbox serve`` runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from ..model import Intent
from ..operations import Authorize
from ..outbox import Outbox
from ..settings import Settings
from . import console, openapi, portal
from .routes import bodies, events, handlers, intents, operators, portal_links, probes, registry, tenant, tokens
from .routes.auth import box
from .web import Head

#: Runs beside the API while it serves, on its outbox: entered once the outbox is open, left at
#: shutdown before it closes. One that runs a sender sets ``app.state.worker`` (``stop()`` is
#: called by :func:`begin_shutdown`) and ``app.state.worker_task`` (``/healthz`` fails once it
#: ends by itself).
Companion = Callable[[FastAPI, Outbox], AbstractAsyncContextManager[object]]


def no_authority(outbox: Outbox) -> Authorize:
    """The authority check of an app given none: every replay is refused, since nothing can say
    whether the intent may be sent now."""

    async def deny(intent: Intent) -> str | None:
        return "this app was given no authority check (outbox.service.create_service gives it the configured one)"

    return deny


def begin_shutdown(app: FastAPI) -> None:
    """Start shutting down as soon as the server is told to, not once its open requests have
    ended: the embedded sender stops claiming and drains, and long polls answer at once. Safe to
    call from a signal handler (``outbox serve`` calls it on SIGTERM and SIGINT)."""

    def begin() -> None:
        app.state.outbox.begin_closing()
        worker = getattr(app.state, "worker", None)
        if worker is not None:
            worker.stop()

    loop: asyncio.AbstractEventLoop | None = getattr(app.state, "loop", None)
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(begin)


def create_app(settings: Settings | None = None, *, outbox: Outbox | None = None, probes_only: bool = False,
               authorizer: Callable[[Outbox], Authorize] = no_authority,
               companions: Sequence[Companion] = ()) -> FastAPI:
    """The API application. Opens the outbox from ``settings`` unless one is given. With
    ``probes_only``, just ``/healthz``, ``/readyz`` and ``/metrics``: what ``outbox worker
    --metrics-port`` serves beside its sender.

    ``authorizer`` makes the check operators' replays ask the authority provider from the open
    outbox (without one, replays are refused); ``companions`` run beside the API while it
    serves. Neither is the API's own: ``outbox.service.create_service`` passes the sender's."""
    settings = settings or (outbox.settings if outbox else Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        app.state.outbox = outbox or await Outbox.open(settings=settings)
        try:
            app.state.authorize = authorizer(app.state.outbox)
            async with AsyncExitStack() as beside:
                for companion in companions:
                    await beside.enter_async_context(companion(app, app.state.outbox))
                yield
        finally:
            if outbox is None:
                await app.state.outbox.close()

    app = FastAPI(
        title="outbox-delivery",
        version="0.1.0",
        description="Durable intents delivered at least once, with honest outcomes.",
        lifespan=lifespan,
        docs_url=None,  # served by openapi.install, from local assets
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
    )
    openapi.install(app)
    app.add_middleware(bodies.BodyLimits, router=app.router, **bodies.limits(settings))
    app.add_middleware(Head, router=app.router)
    handlers.install(app)
    app.include_router(probes.router)
    if probes_only:
        return app
    app.include_router(intents.router)
    app.include_router(events.router)
    app.include_router(operators.router)
    app.include_router(console.router(box, operators.authorize))
    app.add_middleware(console.Guard)  # outermost: it sees every answer under /console, a 500 too
    app.include_router(registry.destinations)
    app.include_router(registry.grants)
    app.include_router(tokens.router)
    app.include_router(tenant.router)
    app.include_router(portal_links.router)
    app.include_router(portal.router())
    app.add_middleware(portal.Guard, settings=settings)
    return app
