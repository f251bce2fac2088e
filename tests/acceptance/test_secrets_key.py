"""The secrets key as an operator meets it: ``outbox serve`` makes it on a fresh machine, ``outbox
secrets rotate`` changes it while the service runs, and a wrong or missing key stops a command with
a clear line. The webhook receiver checks every signature (the receivers' middleware)."""

from __future__ import annotations

import asyncio
import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from outbox.keyring import KEY, generate_key, key_id
from receivers import IdempotencyMiddleware, SqliteRecordStore

from .. import pg
from ..conftest import SECRET
from ..servers import Served
from .conftest import OUTBOX, clean_env
from .test_service import Service

pytestmark = pytest.mark.acceptance


def without_key_file(**settings: str) -> dict[str, str]:
    """``clean_env`` without the key file it gives a PostgreSQL URL."""
    return {k: v for k, v in clean_env(**settings).items() if k != "OUTBOX_SECRETS_KEY_FILE"}


def outbox(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OUTBOX, *args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True,
                          timeout=60)


class Effects:
    """The receiving app: the keys it ran for (only signed requests reach it)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        self.keys.append(scope["state"]["idempotency"].key)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def signed_receiver(tmp_path: Path) -> Iterator[tuple[str, Effects]]:
    effects = Effects()
    records = SqliteRecordStore(tmp_path / "records.db")
    served = Served(IdempotencyMiddleware(effects, records, secrets=SECRET))
    yield served.url, effects
    served.stop()
    asyncio.run(records.close())


def keys_in(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def test_serve_makes_the_key_rotate_changes_it_while_serving_and_deliveries_verify_throughout(
        tmp_path: Path, signed_receiver: tuple[str, Effects]):
    url, effects = signed_receiver
    work = tmp_path / "work"
    work.mkdir()
    service = Service(work)  # with its sender, on the SQLite default in ./outbox.db
    try:
        key_file = work / "outbox.key"
        assert key_file.stat().st_mode & 0o777 == 0o600 and len(keys_in(key_file)) == 1
        admin = {"Authorization": f"Bearer {service.first_admin_token()}"}
        register = {"url": f"{url}/hook", "secret": SECRET, "allow_private_network": True}
        assert httpx.put(f"{service.url}/v1/destinations/hook", json=register, headers=admin).status_code == 201
        assert httpx.put(f"{service.url}/v1/grants/g", json={"scope": "acme", "destination": "hook"},
                         headers=admin).status_code == 201

        def delivered(action_id: str) -> str:
            made = httpx.post(f"{service.url}/v1/intents", headers=admin, json={
                "action_id": action_id, "scope": "acme", "destination": "hook", "payload": {}})
            assert made.status_code == 201, made.text
            return httpx.get(f"{service.url}/v1/intents/{action_id}?wait=20", headers=admin,
                             timeout=30).json()["status"]

        assert delivered("before") == "delivered"
        before = keys_in(key_file)
        rotated = outbox(work, "--json", "secrets", "rotate")
        assert rotated.returncode == 0, rotated.stderr
        after = keys_in(key_file)
        assert len(after) == 1 and after != before and key_file.stat().st_mode & 0o777 == 0o600
        assert '"resealed": 1' in rotated.stdout and key_id(base64.b64decode(after[0])) in rotated.stdout
        # the running service seals and opens under the new key without a restart
        assert httpx.put(f"{service.url}/v1/destinations/hook", json=register, headers=admin).status_code == 200
        assert delivered("after") == "delivered"
    finally:
        service.stop()
    copy = b"".join(p.read_bytes() for p in work.glob("outbox.db*"))
    assert SECRET.encode() not in copy
    assert SECRET not in service.log.read_text() + rotated.stdout + rotated.stderr
    restarted = Service(work)
    restarted.stop()
    assert effects.keys == ["acme/before", "acme/after"]


def test_a_wrong_or_missing_key_stops_every_command_with_one_clear_line(tmp_path: Path):
    made = outbox(tmp_path, "destinations", "put", "hook", "--url", "https://hook.example/", "--secret", SECRET)
    assert made.returncode == 1 and "there is no outbox database" in made.stderr  # (reading commands make none)
    assert outbox(tmp_path, "migrate").returncode == 0
    assert outbox(tmp_path, "destinations", "put", "hook", "--url", "https://hook.example/",
                  "--secret", SECRET).returncode == 0
    key_file = tmp_path / "outbox.key"
    right = key_file.read_text()

    other = generate_key()
    key_file.write_text(other + "\n")
    for command in (["destinations", "list"], ["worker"], ["serve"]):
        done = outbox(tmp_path, *command)
        assert done.returncode != 0, command
        assert "seals destination secrets under key" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert other not in done.stderr and SECRET not in done.stderr + done.stdout

    key_file.unlink()
    done = outbox(tmp_path, "destinations", "list")
    assert done.returncode == 1 and "is missing: restore it from its backup" in done.stderr
    assert not key_file.exists()  # no new key is made over sealed secrets
    key_file.write_text(right)
    assert "hook" in outbox(tmp_path, "destinations", "list").stdout

    printed = outbox(tmp_path, "secrets", "generate-key")
    assert printed.returncode == 0 and KEY.fullmatch(printed.stdout.strip())


def test_rotating_with_an_operator_key_file_on_postgresql(tmp_path: Path):
    url = asyncio.run(pg.create_database())
    try:
        key_file = tmp_path / "secrets.key"
        key_file.write_text(generate_key() + "\n")
        env = {"OUTBOX_DATABASE_URL": url, "OUTBOX_SECRETS_KEY_FILE": str(key_file)}
        assert outbox(tmp_path, "migrate", **env).returncode == 0
        assert outbox(tmp_path, "destinations", "put", "hook", "--url", "https://hook.example/",
                      "--secret", SECRET, **env).returncode == 0
        refused = outbox(tmp_path, "secrets", "rotate", **env)
        assert refused.returncode == 1 and "already seals the secrets: put the new key first" in refused.stderr
        new = generate_key()
        key_file.write_text(new + "\n" + key_file.read_text())
        done = outbox(tmp_path, "secrets", "rotate", **env)
        assert done.returncode == 0 and f"under key {key_id(base64.b64decode(new))}" in done.stdout, done.stderr
        key_file.write_text(new + "\n")  # the old key leaves the file
        assert "hook" in outbox(tmp_path, "destinations", "list", **env).stdout
        unset = subprocess.run([OUTBOX, "destinations", "list"], cwd=tmp_path, capture_output=True, text=True,
                               env=without_key_file(OUTBOX_DATABASE_URL=url), timeout=60)
        assert unset.returncode == 1 and "OUTBOX_SECRETS_KEY_FILE is not set" in unset.stderr
    finally:
        asyncio.run(pg.drop_database(url))
