"""``outbox worker --metrics-port``: a sender without the API that can still be scraped, whose
SIGTERM still drains its in-flight sends."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Status

from ..conftest import SECRET, free_port
from ..receiver import Reply
from .conftest import OUTBOX, clean_env

pytestmark = pytest.mark.acceptance


async def prepare(url: str, base: str) -> None:
    async with await Outbox.open(url) as box:
        for name in ("bad", "slow"):
            await box.put_destination(name, DestinationSpec(
                url=f"{base}/{name}", secret=SECRET, allow_private_network=True))
        await box.enqueue(destination="bad", scope="acme", action_id="job-bad", payload={})
        await box.enqueue(destination="slow", scope="acme", action_id="job-slow", payload={})


async def status(url: str, action_id: str) -> Status:
    async with await Outbox.open(url) as box:
        return (await box.get(action_id)).status


def scrape(base: str, wanted: str, timeout: float = 20) -> str:
    """The /metrics text once it holds the line ``wanted``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = httpx.get(base + "/metrics", timeout=2).text
            if wanted in text.splitlines():
                return text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"/metrics never showed {wanted!r}"
        time.sleep(0.1)


def test_a_worker_serves_its_metrics_and_probes_and_drains_on_sigterm(tmp_path, receiver):
    receiver.script("/bad", Reply(400))
    receiver.script("/slow", Reply(200, delay=1.0))
    url = f"sqlite:///{tmp_path / 'o.db'}"
    asyncio.run(prepare(url, receiver.url))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = clean_env(OUTBOX_DATABASE_URL=url, OUTBOX_AUTHORITY="allow-all", OUTBOX_POLL_SECONDS="0.1",
               OUTBOX_WORKER="false")  # the command runs its sender whatever serve would do
    worker = subprocess.Popen([OUTBOX, "worker", "--metrics-port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        text = scrape(base, "outbox_dead_lettered_total 1.0")
        assert 'outbox_attempts_total{destination="bad",outcome="rejected"} 1.0' in text.splitlines()
        assert 'outbox_intents{channel="webhook",status="dead"} 1.0' in text.splitlines()  # read from the store
        assert httpx.get(base + "/healthz").json() == {"status": "ok"}
        assert httpx.get(base + "/readyz").json() == {"status": "ready"}
        missing = httpx.get(base + "/v1/intents")
        assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"

        receiver.wait_for_requests_blocking(1, "/slow", timeout=20)
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=20)
        assert worker.returncode in (0, -signal.SIGTERM), stderr
    finally:
        worker.kill()
    assert asyncio.run(status(url, "job-slow")) is Status.DELIVERED  # finished within the drain
    assert "Application shutdown complete" in stderr
