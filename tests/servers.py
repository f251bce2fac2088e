"""Serve an ASGI app with a real uvicorn on 127.0.0.1 (a free port), in a background thread: over
HTTPS when its options name a certificate (``ssl_certfile``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class Served:
    """A running uvicorn; ``url`` to reach it, ``stop()`` to end it."""

    def __init__(self, app: Any, **config: Any) -> None:
        options = {"host": "127.0.0.1", "port": 0, "log_level": "warning", **config}
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="uvicorn")
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.005)
        self.port: int = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"{'https' if self.server.config.is_ssl else 'http'}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if self.thread.is_alive():
            raise RuntimeError("uvicorn did not stop")
