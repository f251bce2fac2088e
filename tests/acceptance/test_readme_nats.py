"""The README's NATS JetStream example runs as printed, against the machine's NATS server (a
stream of its own name, deleted after)."""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path

import pytest

from tests.conftest import SECRET
from tests.nats import connect

from .test_readme import load


async def test_the_nats_example_delivers_and_prints_the_stored_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    stream = f"outbox_readme_{secrets.token_hex(6)}"
    monkeypatch.setenv("NATS_STREAM", stream)
    monkeypatch.setenv("NATS_SIGNING_SECRET", SECRET)
    client = await connect()  # (skips, or fails under CI=true, when no server answers)
    monkeypatch.chdir(tmp_path)  # where its database lives
    example = load("nats", tmp_path)
    try:
        await example["main"]()
    finally:
        with contextlib.suppress(Exception):
            await client.jetstream().delete_stream(stream)
        await client.close()
    status, message = capsys.readouterr().out.splitlines()
    assert status == f"delivered {stream}/1"
    data, headers = message.split(" ", 1)
    assert data == """b'{"event":"paid","order":42}'"""
    assert "'idempotency-key': 'acme/order-42-paid'" in headers and "'Nats-Msg-Id': 'acme/order-42-paid'" in headers
    assert "'outbox-fence': '1'" in headers and "'webhook-signature': 'v1," in headers
    assert (tmp_path / "nats.db").exists()
