"""An SQS API for the tests: moto's server (``moto[server]``, in the test extra), in a
subprocess on a free loopback port, killed after. No AWS is reachable from the machines the tests
run on, and moto speaks SQS's wire protocol (the JSON one botocore uses), FIFO deduplication
included.

    server = MotoServer(tmp_path).start()
    url = await server.create_queue("orders-3f2a.fifo")
    server.stop()            # SIGKILL: moto keeps no state, so its queues are gone
    server.start()           # the same port, empty

A server that does not start FAILS the test under ``CI=true`` and skips it elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port

#: How long moto's server may take to accept connections (well under a second here).
START_SECONDS = 30.0
REGION = "eu-west-1"
ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#: The account moto's queues belong to.
ACCOUNT = "123456789012"


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def queue_name(prefix: str = "q", *, fifo: bool = False) -> str:
    """A queue name of the test's own (moto is private to the test, but names say whose it is)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")


class MotoServer:
    """moto's server on 127.0.0.1; ``endpoint`` is its URL."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"moto-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MotoServer:
        """Start the server and wait until it accepts connections."""
        try:
            import moto.server  # noqa: F401 - only to say it is missing
        except ImportError as exc:
            _unavailable(f"moto's server is not installed: {exc}")
        log = self.log_path.open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        _unavailable(f"moto's server did not start on port {self.port}: "
                     f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return self

    def stop(self) -> None:
        """Kill the server (SIGKILL) and wait for it to be gone: its queues and messages with it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.process = None

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[Any]:
        """A plain aiobotocore SQS client of the server (the test's own reader and writer)."""
        from aiobotocore.session import get_session

        async with get_session().create_client(
                "sqs", region_name=REGION, endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY_ID,
                aws_secret_access_key=SECRET_ACCESS_KEY) as client:
            yield client

    async def create_queue(self, name: str) -> str:
        """Create a queue (FIFO when ``name`` ends in ``.fifo``); its URL."""
        attributes = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
        async with self.client() as client:
            return str((await client.create_queue(QueueName=name, Attributes=attributes))["QueueUrl"])

    async def received(self, url: str) -> list[dict[str, Any]]:
        """Every message the queue holds now, with its attributes, each received once (and deleted)."""
        found: list[dict[str, Any]] = []
        async with self.client() as client:
            while True:
                got = (await client.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                    MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
                                                    VisibilityTimeout=30)
                       ).get("Messages", [])
                if not got:
                    return found
                found += got
                await client.delete_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)])
