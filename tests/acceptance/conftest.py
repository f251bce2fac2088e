"""What the acceptance tests share: the installed ``outbox`` command, an environment without the
developer's own ``OUTBOX_*`` settings, an ``outbox worker`` subprocess and its ``kill -9``, an
ASGI app on uvicorn in a thread, and a scripted receiver on uvicorn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from .. import pg
from ..otlp import Collector

OUTBOX = str(Path(sys.executable).parent / "outbox")


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any ``OUTBOX_*`` variable, plus ``settings``; a
    PostgreSQL database URL comes with the run's secrets key file (``tests/pg.py``), which every
    process on one PostgreSQL needs, unless ``settings`` name one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    if settings.get("OUTBOX_DATABASE_URL", "").startswith("postgres"):
        env.update(pg.key_env())
    return {**env, **settings}


@contextmanager
def outbox_worker(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``outbox worker`` in a subprocess with ``env``, in ``tmp_path``, its output in
    ``tmp_path/worker.log``; yields the process and its log. Killed on leaving if still running."""
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen([OUTBOX, "worker"], env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield worker, log
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def kill_9(process: subprocess.Popen[bytes]) -> None:
    """``kill -9`` of ``process``; asserts that it died of it within 10 s."""
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL


@contextmanager
def served_in_thread(app: Any, name: str) -> Iterator[str]:
    """``app`` under uvicorn on 127.0.0.1 at a free port, in a thread (named ``name``) of the test
    process; yields its base URL, ``http://127.0.0.1:PORT``. Stopped on leaving."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=name)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the receiver did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    """An OTLP/HTTP collector on loopback (``tests.otlp``) and its base URL (an exporter's
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; it posts to ``/v1/traces`` under it)."""
    app = Collector()
    with served_in_thread(app, "collector") as url:
        yield app, url
