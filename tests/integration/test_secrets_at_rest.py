"""Destination secrets sealed at rest, on both stores, through a real receiver that checks signatures.

The receiving app runs the receivers' idempotency middleware with the destination's signing
secret, so a delivery counts only when its Standard Webhooks signature verified (a wrong one is
answered 401, which dead-letters the intent). What a copy of the database holds is read from the
files themselves (SQLite's database, WAL and shared-memory files) or every row of the tables
(PostgreSQL).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from outbox import DestinationSpec, Outbox, Role, SecretsKeyError, Settings, Status
from outbox.keyring import generate_key, key_id
from outbox.secrets_key import rotate
from receivers import IdempotencyMiddleware, SqliteRecordStore
from sender import Worker

from ..conftest import SECRET, rows
from ..servers import Served

SMTP_PASSWORD = "smtp-password-7f3a9c"
SASL_PASSWORD = "sasl-password-51d2e8"
#: The Kafka destination's signing secret (its records are signed as webhooks are).
RECORDS_SECRET = "whsec_" + base64.b64encode(b"records-signing-secret-0123456789").decode()
#: Every secret registered below, and the signing secret's raw bytes (what HMAC is keyed with).
REGISTERED = (SECRET, SMTP_PASSWORD, SASL_PASSWORD, RECORDS_SECRET)
RAW = base64.b64decode(SECRET.removeprefix("whsec_"))


class Effects:
    """The receiving application: notes each key it ran for."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.keys.append(scope["state"]["idempotency"].key)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
async def signed_receiver(tmp_path: Path) -> AsyncIterator[tuple[str, Effects]]:
    """A receiver (receivers.IdempotencyMiddleware) that checks every request's signature against
    SECRET; its URL and its effects."""
    effects = Effects()
    records = SqliteRecordStore(tmp_path / "records.db")
    served = Served(IdempotencyMiddleware(effects, records, secrets=SECRET))
    yield served.url, effects
    served.stop()
    await records.close()


def own_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_url: str) -> Path:
    """The key file this test's outboxes use: on SQLite the default beside the database (made on
    first start), on PostgreSQL one of the test's own (the operator's file)."""
    if store_url.startswith("sqlite:"):
        monkeypatch.delenv("OUTBOX_SECRETS_KEY_FILE", raising=False)
        return Path(store_url.removeprefix("sqlite:///")).with_suffix(".key")
    path = tmp_path / "secrets.key"
    path.write_text(generate_key() + "\n")
    path.chmod(0o600)
    monkeypatch.setenv("OUTBOX_SECRETS_KEY_FILE", str(path))
    return path


async def register(box: Outbox, url: str) -> None:
    """A webhook signed with SECRET, and an email and a Kafka destination with passwords."""
    await box.put_destination("hook", DestinationSpec(url=f"{url}/hook", secret=SECRET, allow_private_network=True))
    await box.put_destination("mail", DestinationSpec.model_validate({
        "channel": "email", "host": "127.0.0.1", "port": 2525, "tls": "none", "allow_insecure": True,
        "allow_private_network": True, "username": "outbox", "secret": SMTP_PASSWORD, "from": "outbox@example.com"}))
    await box.put_destination("topic", DestinationSpec.model_validate({
        "channel": "kafka", "bootstrap_servers": ["127.0.0.1:9092"], "topic": "orders", "sasl_mechanism": "PLAIN",
        "sasl_username": "outbox", "allow_insecure": True, "allow_private_network": True, "secret": RECORDS_SECRET,
        "sasl_password": SASL_PASSWORD}))


async def deliver(box: Outbox, action_id: str) -> Status:
    """Enqueue one intent to ``hook`` and let a worker send it; its status afterwards."""
    await box.enqueue(destination="hook", scope="acme", action_id=action_id, payload={"n": action_id})
    worker = Worker(box)
    try:
        await worker.run_once()
    finally:
        await worker.aclose()
    return (await box.get(action_id)).status


async def copy_of(store_url: str) -> bytes:
    """What a copy of the database holds: SQLite's files as they are on disk, or every row of
    PostgreSQL's destinations and secrets_key tables."""
    if store_url.startswith("sqlite:"):
        database = Path(store_url.removeprefix("sqlite:///"))
        files = [database, *(database.with_name(database.name + end) for end in ("-wal", "-shm"))]
        return b"".join(path.read_bytes() for path in files if path.exists())
    found = await rows(store_url, "SELECT d::text FROM destinations AS d UNION ALL "
                                  "SELECT k::text FROM secrets_key AS k")
    return "\n".join(text for (text,) in found).encode()


async def assert_no_secret_in(store_url: str) -> None:
    copy = await copy_of(store_url)
    assert b'"hook"' in copy or b"hook" in copy  # (the copy is of the right database)
    for secret in REGISTERED:
        assert secret.encode() not in copy, f"{secret!r} is readable in a copy of the database"
    assert RAW not in copy


async def sealed_under(store_url: str) -> set[str]:
    """The keys the stored secrets name."""
    return {json.loads(text)["key"] for (text,) in await rows(store_url, "SELECT secrets FROM destinations")}


async def test_a_copy_of_the_database_reveals_no_secret_and_deliveries_verify_after_restart_and_rotation(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signed_receiver: tuple[str, Effects]):
    url, effects = signed_receiver
    key_file = own_key_file(tmp_path, monkeypatch, store_url)
    settings = Settings(authority="allow-all")
    async with await Outbox.open(store_url, settings=settings) as box:
        await register(box, url)
        assert {d.id: d.secrets for d in await box.list_destinations()} == {
            "hook": (SECRET,), "mail": (SMTP_PASSWORD,), "topic": (RECORDS_SECRET, SASL_PASSWORD)}
        assert await deliver(box, "before-restart") is Status.DELIVERED
        await assert_no_secret_in(store_url)  # with the store open: its WAL included
        first = await box.store.sealing_key()
    assert key_file.stat().st_mode & 0o777 == 0o600
    await assert_no_secret_in(store_url)

    async with await Outbox.open(store_url, settings=settings) as box:  # a restart
        assert await deliver(box, "after-restart") is Status.DELIVERED
        if box.store.dialect == "postgres":  # the operator puts the new key first in the file
            key_file.write_text(generate_key() + "\n" + key_file.read_text())
        done = await rotate(box.store)
        assert (done.previous, done.resealed) == (first, 3) and done.key != first
        assert await sealed_under(store_url) == {done.key} and await box.store.sealing_key() == done.key
        assert await deliver(box, "after-rotation") is Status.DELIVERED  # the same process, on
        await assert_no_secret_in(store_url)

    if box.store.dialect == "postgres":  # the old key leaves the file once nothing is sealed under it
        key_file.write_text(key_file.read_text().splitlines()[0] + "\n")
    assert [key_id(base64.b64decode(line)) for line in key_file.read_text().splitlines()
            if not line.startswith("#")] == [done.key]
    async with await Outbox.open(store_url, settings=settings) as box:
        assert await deliver(box, "after-rotation-and-restart") is Status.DELIVERED
        assert {d.id: d.secrets for d in await box.list_destinations()}["mail"] == (SMTP_PASSWORD,)
    await assert_no_secret_in(store_url)
    assert effects.keys == ["acme/before-restart", "acme/after-restart", "acme/after-rotation",
                            "acme/after-rotation-and-restart"]


async def test_the_receiver_refuses_a_wrong_signature(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      signed_receiver: tuple[str, Effects]):
    """What makes "delivered" above mean "verified": another secret's signature is refused."""
    url, effects = signed_receiver
    own_key_file(tmp_path, monkeypatch, store_url)
    async with await Outbox.open(store_url, settings=Settings(authority="allow-all")) as box:
        await box.put_destination("hook", DestinationSpec(url=f"{url}/hook", secret="whsec_" + "A" * 44,
                                                          allow_private_network=True))
        assert await deliver(box, "forged") is Status.DEAD
        assert "401" in (await box.get("forged")).last_error
    assert effects.keys == []


async def test_secrets_stored_plain_by_an_older_release_are_sealed_on_open(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signed_receiver: tuple[str, Effects]):
    url, effects = signed_receiver
    own_key_file(tmp_path, monkeypatch, store_url)
    async with await Outbox.open(store_url, settings=Settings(authority="allow-all")) as box:
        await register(box, url)
    # what a database of the previous release holds once migration 0010 ran: plain lists, no key named
    await rows(store_url, f"""UPDATE destinations SET secrets = '{json.dumps([SECRET])}' WHERE id = 'hook'""")
    await rows(store_url, f"""UPDATE destinations SET secrets = '{json.dumps([SMTP_PASSWORD])}' WHERE id = 'mail'""")
    await rows(store_url, "DELETE FROM secrets_key")
    assert SECRET.encode() in await copy_of(store_url)

    async with await Outbox.open(store_url, settings=Settings(authority="allow-all")) as box:
        key = await box.store.sealing_key()
        assert key is not None and await sealed_under(store_url) == {key}
        assert (await box.get_destination("mail")).secrets == (SMTP_PASSWORD,)
        assert await deliver(box, "upgraded") is Status.DELIVERED
    await assert_no_secret_in(store_url)  # on SQLite, overwritten in the file, not only unlinked
    assert effects.keys == ["acme/upgraded"]


async def test_a_missing_or_wrong_key_file_is_a_clear_error_at_open(store_url: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch):
    key_file = own_key_file(tmp_path, monkeypatch, store_url)
    async with await Outbox.open(store_url) as box:
        await box.put_destination("hook", DestinationSpec(url="https://hook.example/", secret=SECRET))
        sealing = await box.store.sealing_key()
    right = key_file.read_text()

    other = generate_key()
    key_file.write_text(other + "\n")
    with pytest.raises(SecretsKeyError) as wrong:
        await Outbox.open(store_url)
    assert f"the database seals destination secrets under key {sealing}" in wrong.value.message
    assert str(key_file) in wrong.value.message and other not in wrong.value.message

    key_file.write_text(right + "not a key\n")
    with pytest.raises(SecretsKeyError, match=r"line \d+ of .* is not a key") as malformed:
        await Outbox.open(store_url)
    assert "not a key\n" not in malformed.value.message.split("is not a key")[0]

    key_file.unlink()
    with pytest.raises(SecretsKeyError) as missing:
        await Outbox.open(store_url)
    if box.store.dialect == "sqlite":  # the default is never made anew over sealed secrets
        assert f"sealed under key {sealing}, but its key file {key_file} is missing" in missing.value.message
    else:
        assert f"OUTBOX_SECRETS_KEY_FILE names {key_file}, which does not exist" in missing.value.message
    assert not key_file.exists()

    key_file.write_text(right)
    async with await Outbox.open(store_url) as box:
        assert (await box.get_destination("hook")).secrets == (SECRET,)


async def test_postgresql_without_a_key_file_setting_refuses_to_open(pg_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OUTBOX_SECRETS_KEY_FILE")
    with pytest.raises(SecretsKeyError, match="OUTBOX_SECRETS_KEY_FILE is not set: on PostgreSQL"):
        await Outbox.open(pg_url)


async def test_processes_sharing_a_database_rotate_by_the_documented_steps(
        store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signed_receiver: tuple[str, Effects]):
    """Two processes, each with its own copy of the key file: give both the new key (first), rotate
    once from one of them, and the other seals and opens under the new key without a restart
    (it reads its file again when a value names a key it does not hold). A process whose file
    never got the new key sends nothing and says why."""
    url, effects = signed_receiver
    first = tmp_path / "first.key"
    first.write_text(generate_key() + "\n")
    copies = [tmp_path / f"{name}.key" for name in ("a", "b", "late")]
    for copy in copies:
        copy.write_text(first.read_text())
    a, b, late = [await Outbox.open(store_url, settings=Settings(secrets_key_file=path, authority="allow-all"))
                  for path in copies]
    try:
        await a.put_destination("hook", DestinationSpec(url=f"{url}/hook", secret=SECRET, allow_private_network=True))
        new = generate_key()
        for path in copies[:2]:  # step 1: every process's file holds the new key first, the old one after
            path.write_text(new + "\n" + first.read_text())
        done = await rotate(a.store)  # step 2: one rotation, from any process
        assert done.key == key_id(base64.b64decode(new)) and done.resealed == 1
        assert (await b.get_destination("hook")).secrets == (SECRET,)  # b opens under the new key
        await b.put_destination("hook", DestinationSpec(url=f"{url}/hook", secret=SECRET, allow_private_network=True))
        assert await sealed_under(store_url) == {done.key}  # and seals under it
        assert await deliver(b, "by-b") is Status.DELIVERED

        with pytest.raises(SecretsKeyError, match=f"sealed under key {done.key}"):
            await late.get_destination("hook")
        assert await deliver(late, "by-late") is Status.PENDING  # nothing sent: released, retried later
        history = await late.history("by-late")
        assert history.attempts == [] and f"sealed under key {done.key}" in (history.events[-1].reason or "")
    finally:
        for box in (a, b, late):
            await box.close()
    for path in copies[:2]:  # step 3: the old key leaves the files
        path.write_text(new + "\n")
    async with await Outbox.open(store_url, settings=Settings(secrets_key_file=copies[0], authority="allow-all")) as c:
        assert await deliver(c, "after-the-old-key-left") is Status.DELIVERED
    assert effects.keys == ["acme/by-b", "acme/after-the-old-key-left"]


async def test_the_api_answers_a_key_it_lacks_with_a_problem_that_names_the_key_only(
        store_url: str, tmp_path: Path, serve_api):
    mine, its = tmp_path / "mine.key", tmp_path / "api.key"
    mine.write_text(generate_key() + "\n")
    its.write_text(mine.read_text())
    async with await Outbox.open(store_url, settings=Settings(secrets_key_file=mine)) as box:
        await box.put_destination("hook", DestinationSpec(url="https://hook.example/", secret=SECRET))
        admin, _ = await box.create_token(Role.ADMIN)
        api = serve_api(Settings(database_url=store_url, secrets_key_file=its, worker=False))
        mine.write_text(generate_key() + "\n" + mine.read_text())
        done = await rotate(box.store)  # the API's file never gets the new key
    async with httpx.AsyncClient(base_url=api, headers={"Authorization": f"Bearer {admin}"}) as client:
        for path in ("/v1/destinations/hook", "/v1/destinations"):
            answer = await client.get(path)
            assert answer.status_code == 503 and answer.headers["content-type"] == "application/problem+json"
            problem = answer.json()
            assert problem["type"] == "urn:outbox:problem:secrets-key" and done.key in problem["detail"]
            assert SECRET not in answer.text and RAW.hex() not in answer.text
