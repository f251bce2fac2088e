"""The README's Python examples run as printed."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from outbox.keyring import KEY, key_id
from receivers import IdempotencyMiddleware
from receivers.wire import sign

from ..kafka import Broker
from .conftest import clean_env

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> dict[str, str]:
    """Every ```python block, by its ``# example: NAME`` first line (``main`` when unnamed)."""
    blocks = {}
    for code in re.findall(r"```python\n(.*?)```", README.read_text(), re.S):
        named = re.match(r"# example: ([\w-]+)\n", code)
        blocks[named.group(1) if named else "main"] = code
    return blocks


def load(name: str, where: Path) -> dict[str, Any]:
    """Run an example's module code (not as __main__) in ``where``; returns its namespace."""
    namespace: dict[str, Any] = {"__name__": f"readme_{name.replace('-', '_')}"}
    cwd = os.getcwd()
    os.chdir(where)
    try:
        exec(compile(python_blocks()[name], f"README:{name}", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_the_readme_has_its_examples():
    assert set(python_blocks()) == {"main", "fastapi-receiver", "flask-receiver", "channel-declaration", "email",
                                    "kafka", "kafka-consumer", "postgres-transaction", "client"}


def test_the_producer_example_runs_and_is_safe_to_run_again(tmp_path: Path):
    script = tmp_path / "example.py"
    script.write_text(python_blocks()["main"])
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "shop.db").exists()
    assert done.stdout.startswith("False pending sha256:")


async def test_the_fastapi_receiver_makes_one_effect_and_refuses_forgeries(tmp_path: Path):
    example = load("fastapi-receiver", tmp_path)
    body = b'{"invoice": 42}'
    stamp = int(time.time())
    signed = {"content-type": "application/json", "idempotency-key": "invoice-42",
              "webhook-id": "invoice-42", "webhook-timestamp": str(stamp),
              "webhook-signature": sign((example["SECRET"],), "invoice-42", stamp, body)}
    transport = httpx.ASGITransport(example["app"])
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
        first = await client.post("/webhooks/billing", content=body, headers=signed)
        again = await client.post("/webhooks/billing", content=body, headers=signed)
        forged = await client.post("/webhooks/billing", content=b'{"invoice": 1}',
                                   headers={**signed, "idempotency-key": "other"})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() == {"external_id": "inv-1"}
    assert again.headers["idempotent-replayed"] == "true"
    assert forged.status_code == 401
    assert example["invoices"] == [("invoice-42", 1)]
    layer = example["app"].middleware_stack
    while not isinstance(layer, IdempotencyMiddleware):
        layer = layer.app
    await layer.idempotency.aclose()


def test_the_flask_receiver_makes_one_effect(tmp_path: Path):
    example = load("flask-receiver", tmp_path)
    client = example["app"].test_client()
    body, stamp = b'{"parcel": 7}', int(time.time())
    signed = {"Content-Type": "application/json", "Idempotency-Key": "parcel-7", "webhook-id": "parcel-7",
              "webhook-timestamp": str(stamp), "webhook-signature": sign((example["SECRET"],), "parcel-7", stamp, body)}
    first = client.post("/webhooks/shipping", data=body, headers=signed)
    again = client.post("/webhooks/shipping", data=body, headers=signed)
    unsigned = client.post("/webhooks/shipping", json={"parcel": 8}, headers={"Idempotency-Key": "parcel-8"})
    assert first.status_code == again.status_code == 201
    assert unsigned.status_code == 401
    assert first.get_json() == again.get_json() == {"shipment": 1}
    assert again.headers["Idempotent-Replayed"] == "true"
    assert example["shipped"] == ["parcel-7"]
    example["app"].wsgi_app.close()


def test_the_channel_declaration_shown_is_the_webhook_channels(tmp_path: Path):
    from sender import webhook

    shown = load("channel-declaration", tmp_path)["CHANNEL"]
    for field in ("name", "spec", "needs_secret", "secret_form", "new_secret", "check_payload"):
        assert getattr(shown, field) == getattr(webhook.CHANNEL, field), field
    assert isinstance(shown.open(4), webhook.WebhookChannel)


def test_the_email_example_delivers_and_shows_the_servers_view(tmp_path: Path):
    script = tmp_path / "email_example.py"
    script.write_text(python_blocks()["email"])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "delivered done 4BX2Q"
    headers = dict(line.split(": ", 1) for line in lines[:-1] if ": " in line)
    assert headers["Message-ID"] == "<acme/receipt-42@example.com>"
    assert headers["From"] == "Shop <shop@example.com>" and headers["To"] == "Ann <ann@example.org>"
    assert headers["Idempotency-Key"] == "acme/receipt-42" and headers["Outbox-Fence"] == "1"
    assert headers["Payload-Digest"].startswith("sha256:")


def test_the_kafka_example_produces_one_record_with_its_identity(tmp_path: Path, kafka: Broker):
    script = tmp_path / "kafka_example.py"
    script.write_text(python_blocks()["kafka"])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "KAFKA_BOOTSTRAP": kafka.bootstrap})
    assert done.returncode == 0, done.stderr
    status, record = done.stdout.splitlines()
    assert status == "delivered orders/0/0"
    key, value, headers = record.split(" ", 2)
    assert (key, value) == ("b'order-42'", """b'{"event":"paid","order":42}'""")
    assert "'idempotency-key': b'acme/order-42-paid'" in headers and "'outbox-fence': b'1'" in headers


async def test_the_postgres_transaction_example_commits_the_intent_with_the_order(tmp_path: Path):
    from tests import pg

    async with pg.database() as url:
        script = tmp_path / "pg_example.py"
        script.write_text(python_blocks()["postgres-transaction"])
        env = {**os.environ, "OUTBOX_DATABASE_URL": url, **pg.key_env()}  # as Running on PostgreSQL says
        for _ in range(2):  # safe to run again: the same order and intent
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["False", "pending"]
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM orders") == 1
            assert await conn.fetchval("SELECT count(*) FROM intents WHERE action_id = 'order-42-invoice'") == 1
        finally:
            await conn.close()


def test_the_secrets_key_walkthrough_makes_a_key_file_postgresql_opens_with(tmp_path: Path):
    """The Security section's commands, run by bash as printed, then `outbox migrate` on a fresh
    PostgreSQL database in the same shell: the key file is private and is the one used."""
    from tests import pg

    url = asyncio.run(pg.create_database())
    try:
        block = shell_block_after("### The secrets key")
        env = {**clean_env(OUTBOX_DATABASE_URL=url), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        env.pop("OUTBOX_SECRETS_KEY_FILE")  # the block exports its own
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{block}\noutbox migrate"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        key_file = tmp_path / "secrets.key"
        assert key_file.stat().st_mode & 0o777 == 0o600 and KEY.fullmatch(key_file.read_text().strip())
        assert asyncio.run(sealing_key(url)) == key_id(base64.b64decode(key_file.read_text()))
    finally:
        asyncio.run(pg.drop_database(url))


async def sealing_key(url: str) -> str | None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SELECT key_id FROM secrets_key")
    finally:
        await conn.close()


def shell_block_after(heading: str, nth: int = 0) -> str:
    """The ``nth`` ```sh block after a README heading."""
    text = README.read_text()
    return re.findall(r"```sh\n(.*?)```", text[text.index(heading):], re.S)[nth]


def test_the_http_walkthrough_delivers_as_written(tmp_path: Path):
    """Over HTTP, run as printed by bash in the directory `outbox serve` runs in, with the
    `outbox` of the activated virtualenv; only the admin token, the service's and the
    receiver's ports are this run's."""
    from ..receiver import Receiver, Reply
    from .test_service import Service

    receiver = Receiver().start()
    receiver.script("/webhooks", Reply(200, body={"external_id": "inv-42"}))
    service = Service(tmp_path)
    try:
        admin = service.first_admin_token()
        assert admin is not None

        def run(block: str) -> str:
            script = (block.replace("ADMIN=obx_...", f"ADMIN={admin}")
                      .replace("localhost:8080", f"127.0.0.1:{service.port}")
                      .replace("http://127.0.0.1:9000", receiver.url))
            env = {**clean_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{exported}\n{script}"], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=90)
            assert done.returncode == 0, done.stderr
            return done.stdout

        exported = ""
        enqueue = shell_block_after("### Over HTTP")
        shown = run(enqueue + '\necho; echo "PRODUCER=$PRODUCER"')
        assert "HTTP/1.1 201 Created" in shown and '"status":"pending"' in shown
        exported = next(line for line in shown.splitlines() if line.startswith("PRODUCER="))
        read_back = run(shell_block_after("### Over HTTP", 1))
        assert '"action_id":"invoice-42-send"' in read_back
        settled = json.loads(run(shell_block_after("### Learning the outcome")))
        assert settled["status"] == "delivered" and settled["settled"] is True
        assert settled["attempts"][-1]["external_id"] == "inv-42"
        assert [r.headers["idempotency-key"] for r in receiver.requests("/webhooks")] == ["acme/invoice-42-send"]
    finally:
        service.stop()
        receiver.stop()


def test_the_runbooks_page_is_a_page_in_the_alert_rules():
    import yaml

    paged = re.search(r"\*\*03:02 — the page\.\*\* `(\w+)` fires \(`severity: (\w+)`", README.read_text())
    assert paged is not None
    rules = yaml.safe_load((README.parent / "deploy" / "prometheus" / "alerts.yml").read_text())
    severity = {r["alert"]: r["labels"]["severity"] for g in rules["groups"] for r in g["rules"]}
    assert severity[paged.group(1)] == paged.group(2) == "page"


def test_the_python_example_grants_what_it_enqueues():
    example = python_blocks()["main"]
    assert 'GrantSpec(scope="acme", destination="billing")' in example
