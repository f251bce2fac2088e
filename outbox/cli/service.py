"""Running the outbox: ``serve`` (the HTTP API with an embedded sender), ``worker`` (a sender
alone), ``demo`` and ``migrate``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import OutboxError
from ..model import Role
from .context import Context, run_migrating
from .options import env, log_options

if TYPE_CHECKING:
    from types import FrameType

    from fastapi import FastAPI

    from ..outbox import Outbox
    from ..settings import Settings


@click.command()
@click.option("--host", help="Listen address [default: 127.0.0.1]", **env("host"))
@click.option("--port", type=int, help="Listen port [default: 8080]", **env("port"))
@log_options
@click.option("--worker/--no-worker", default=None, help="Run an embedded sender [default: --worker]", **env("worker"))
@click.option("--tls-certfile", type=click.Path(dir_okay=False, path_type=Path),
              help="Serve HTTPS with this PEM certificate chain [default: none, plain HTTP]", **env("tls_certfile"))
@click.option("--tls-keyfile", type=click.Path(dir_okay=False, path_type=Path),
              help="The certificate's PEM private key, unencrypted [default: in --tls-certfile]", **env("tls_keyfile"))
@click.option("--proxy-headers/--no-proxy-headers", default=None,
              help="Believe X-Forwarded-Proto and X-Forwarded-For from the proxies --forwarded-allow-ips names "
                   "[default: --no-proxy-headers]", **env("proxy_headers"))
@click.option("--forwarded-allow-ips",
              help="The trusted proxies: addresses or networks, comma-separated, or * [default: 127.0.0.1,::1]",
              **env("forwarded_allow_ips"))
@click.pass_obj
def serve(ctx: Context, host: str | None, port: int | None, log_level: str | None, log_format: str | None,
          worker: bool | None, tls_certfile: Path | None, tls_keyfile: Path | None, proxy_headers: bool | None,
          forwarded_allow_ips: str | None) -> None:
    """Run the HTTP API and an embedded sender (migrating the database first).

    On first start, when no admin token exists, one is created and printed once. Behind a
    TLS proxy, name it (--proxy-headers --forwarded-allow-ips) so that the console's cookies
    are Secure; or serve TLS here (--tls-certfile).
    """
    import asyncio

    from .. import logs
    from ..outbox import Outbox
    from ..service import create_service, listening

    settings = ctx.settings(host=host, port=port, log_level=log_level, log_format=log_format, worker=worker,
                            tls_certfile=tls_certfile, tls_keyfile=tls_keyfile, proxy_headers=proxy_headers,
                            forwarded_allow_ips=forwarded_allow_ips)
    logs.configure(settings.log_level, settings.log_format)
    if settings.tls_certfile is not None:
        _check_tls(settings.tls_certfile, settings.tls_keyfile)

    async def bootstrap() -> str | None:
        async with await Outbox.open(settings=settings) as box:
            if await box.store.count_active_tokens(Role.ADMIN.value):
                return None
            token, _ = await box.create_token(Role.ADMIN, label="first start")
            return token

    try:
        token = asyncio.run(bootstrap())
    except OutboxError as exc:
        raise click.ClickException(exc.message) from None
    if token:
        click.echo(
            "\nNo admin token existed, so one was created. It is shown only this once:\n\n"
            f"    {token}\n\n"
            "Keep it secret; create more with `outbox tokens create`.\n",
            err=True,
        )
    with _traced():
        _serve(create_service(settings), settings, settings.port, **listening(settings))


def _check_tls(certfile: Path, keyfile: Path | None) -> None:
    """Stop with one line, before anything starts, when the certificate or key cannot be used."""
    import ssl

    names = f"{certfile}" + (f" and {keyfile}" if keyfile is not None else "")
    try:  # an empty password: an encrypted key is refused, not asked for on a terminal
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile, password=b"")
    except ssl.SSLError:
        raise click.ClickException(f"cannot serve TLS with {names}: they are not a PEM certificate chain and its "
                                   "private key (unencrypted; in the same file unless --tls-keyfile names it)"
                                   ) from None
    except OSError as exc:
        raise click.ClickException(f"cannot serve TLS with {names}: {exc.strerror or exc}") from None


@contextmanager
def _traced() -> Iterator[None]:
    """Export traces while the process runs, if the ``OTEL_*`` variables ask (``tracing.configure``),
    and flush the last spans when it ends."""
    from .. import tracing

    stop = tracing.configure()
    try:
        yield
    finally:
        if stop is not None:
            stop()


def _serve(app: FastAPI, settings: Settings, port: int, **options: Any) -> None:
    """Run ``app`` under uvicorn until SIGTERM or SIGINT. The signal itself starts the app's
    shutdown (``api.begin_shutdown``): uvicorn's own waits for open requests to end first."""
    import uvicorn

    from ..api import begin_shutdown

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            begin_shutdown(app)

    config = uvicorn.Config(app, host=settings.host, port=port, log_level=settings.log_level,
                            log_config=None,  # its lines go through logs.configure's handler too
                            **options)
    server = Server(config)
    server.run()
    if not server.started:
        sys.exit(3)  # as uvicorn.run: the server could not start (the log says why)


@click.command()
@click.option("--concurrency", type=int, help="Sends in flight [default: 64]", **env("worker_concurrency"))
@log_options
@click.option("--metrics-port", type=int,
              help="Also serve /metrics, /healthz and /readyz on this port [default: none]",
              **env("metrics_port"))
@click.pass_obj
def worker(ctx: Context, concurrency: int | None, log_level: str | None, log_format: str | None,
           metrics_port: int | None) -> None:
    """Run a sender without the API; SIGTERM drains in-flight sends and stops."""
    import asyncio
    import signal

    from sender import Worker

    from .. import logs
    from ..outbox import Outbox

    settings = ctx.settings(worker_concurrency=concurrency, log_level=log_level, log_format=log_format,
                            metrics_port=metrics_port)
    logs.configure(settings.log_level, settings.log_format)
    if settings.metrics_port is not None:
        from ..service import create_service

        # the server owns SIGTERM here: it stops the sender, which drains as below
        with _traced():
            _serve(create_service(settings.model_copy(update={"worker": True}), probes_only=True), settings,
                   settings.metrics_port, access_log=False)
        return

    async def run() -> None:
        async with await Outbox.open(settings=settings) as box:
            sender = Worker(box)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, sender.stop)
            await sender.run()

    try:
        with _traced():
            asyncio.run(run())
    except OutboxError as exc:
        raise click.ClickException(exc.message) from None


@click.command()
def demo() -> None:
    """Deliver a few intents to a local receiver and show what happened (no setup needed)."""
    import asyncio
    import logging

    from sender.demo import run_demo

    logging.basicConfig(level=logging.ERROR)  # the demo narrates what matters itself
    sys.exit(asyncio.run(run_demo(click.echo)))


@click.command()
@run_migrating
async def migrate(ctx: Context, box: Outbox) -> None:
    """Apply pending schema migrations (serve also does this on start)."""
    from .. import secrets_key

    applied = await box.store.migrate()
    await secrets_key.unlock(box.store, box.settings)  # checks the key, makes it on first start, seals plain secrets
    ctx.emit({"database_url": box.settings.database_url, "status": "migrated", "applied": applied},
             f"applied {len(applied)} migration{'' if len(applied) == 1 else 's'}: {', '.join(applied)}" if applied
             else "database is up to date: no migration to apply")
