"""The README's walkthroughs and Python examples run as printed: its own text is what runs, a
shell block by bash in a fresh directory with the virtualenv's commands first on PATH, as a
newcomer who activated it would; only ports, tokens and database names are this run's."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import httpx

from outbox.keyring import KEY, key_id
from outbox.store.migrator import scripts_for
from receivers import IdempotencyMiddleware
from receivers.wire import sign

from ..conftest import free_port
from .conftest import clean_env

README = Path(__file__).resolve().parents[2] / "README.md"
CHANGELOG = README.with_name("CHANGELOG.md")
#: Where the virtualenv's commands are (outbox, uvicorn, flask, noida-db, pip).
VENV_BIN = Path(sys.executable).parent
#: How a block is run: stopping at the first command that fails.
BASH = ["bash", "-euo", "pipefail", "-c"]


def python_blocks() -> dict[str, str]:
    """Every ```python block, by its ``# example: NAME`` first line (``main`` when unnamed)."""
    blocks = {}
    for code in re.findall(r"```python\n(.*?)```", README.read_text(), re.S):
        named = re.match(r"# example: ([\w-]+)\n", code)
        blocks[named.group(1) if named else "main"] = code
    return blocks


def shell_block_after(heading: str, nth: int = 0) -> str:
    """The ``nth`` ```sh block of the README's section under ``heading`` (up to the next heading
    of its level or above: a ``###`` section's blocks include those of its ``####`` parts)."""
    text = README.read_text()
    section = text[text.index(heading + "\n"):]
    level = len(heading) - len(heading.lstrip("#"))
    following = re.search(rf"\n#{{2,{level}}} ", section[len(heading):])
    blocks = re.findall(r"```sh\n(.*?)```", section[:len(heading) + following.start()] if following else section, re.S)
    assert len(blocks) > nth, f"the README's {heading!r} has {len(blocks)} shell blocks, not {nth + 1}"
    return blocks[nth]


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


def newcomer_env(**extra: str) -> dict[str, str]:
    """A shell in the activated virtualenv, without the developer's OUTBOX_* settings; ``pip``
    installs nothing from a registry (what the README installs is already there, from the test
    extra, so its ``pip install`` lines only confirm it)."""
    return {**clean_env(), "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PIP_NO_INDEX": "1", **extra}


def bash(script: str, cwd: Path, **env: str) -> str:
    """Run ``script`` as bash would, stopping at the first failing command; returns its output."""
    done = subprocess.run([*BASH, script], cwd=cwd, env=newcomer_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{script}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done.stdout


@contextmanager
def started(script: str, cwd: Path, port: int) -> Iterator[Path]:
    """A block that starts a server (``uvicorn ...``, ``flask run``), run by bash in ``cwd`` in the
    background until something listens on ``port``; yields its log. Stopped, with every process
    it started, on leaving."""
    log = cwd / f"started-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*BASH, script], cwd=cwd, env=newcomer_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def listening(port: int) -> bool:
    """Whether something on 127.0.0.1 accepts connections on ``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def signed(secret: str, key: str, body: bytes) -> dict[str, str]:
    """The headers the webhook channel sends with ``body`` under ``key``, signed with ``secret``."""
    stamp = int(time.time())
    return {"Content-Type": "application/json", "Idempotency-Key": key, "webhook-id": key,
            "webhook-timestamp": str(stamp), "webhook-signature": sign((secret,), key, stamp, body)}


def test_the_readme_has_its_examples():
    assert set(python_blocks()) == {"main", "fastapi-receiver", "flask-receiver", "channel-declaration", "email",
                                    "kafka", "kafka-consumer", "rabbitmq-consumer", "nats-consumer", "redis", "nats",
                                    "sqs", "rabbitmq", "postgres-transaction", "client",
                                    "harness-pydantic-ai", "receiver-tracing", "tracing", "sqlite3-transaction",
                                    "psycopg-transaction", "django-settings", "django-models", "django-view",
                                    "django-urls", "flask-sqlalchemy", "alembic-env", "fastapi-sqlalchemy"}


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
    headers = signed(example["SECRET"], "invoice-42", body)
    transport = httpx.ASGITransport(example["app"])
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as client:
        first = await client.post("/webhooks/billing", content=body, headers=headers)
        again = await client.post("/webhooks/billing", content=body, headers=headers)
        forged = await client.post("/webhooks/billing", content=b'{"invoice": 1}',
                                   headers={**headers, "Idempotency-Key": "other"})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() == {"external_id": "inv-1"}
    assert again.headers["idempotent-replayed"] == "true"
    assert forged.status_code == 401
    assert example["invoices"] == [("invoice-42", 1)]
    layer = example["app"].middleware_stack
    while not isinstance(layer, IdempotencyMiddleware):
        layer = layer.app
    await layer.idempotency.aclose()


def test_the_flask_receiver_runs_as_the_readme_installs_and_starts_it(tmp_path: Path):
    example = python_blocks()["flask-receiver"]
    secret = re.search(r'SECRET = "(whsec_\w+)"', example)
    assert secret is not None
    (tmp_path / "shipping.py").write_text(example)
    block = shell_block_after("### Flask")
    assert "pip install flask\n" in block and "flask --app shipping run --port 9001" in block
    port = free_port()
    with started(block.replace("--port 9001", f"--port {port}"), tmp_path, port):
        url = f"http://127.0.0.1:{port}/webhooks/shipping"
        body = b'{"parcel": 7}'
        first = httpx.post(url, content=body, headers=signed(secret.group(1), "parcel-7", body))
        again = httpx.post(url, content=body, headers=signed(secret.group(1), "parcel-7", body))
        unsigned = httpx.post(url, json={"parcel": 8}, headers={"Idempotency-Key": "parcel-8"})
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() == {"shipment": 1}  # the handler ran once: a second run says 2
    assert again.headers["Idempotent-Replayed"] == "true" and "idempotent-replayed" not in first.headers
    assert unsigned.status_code == 401
    assert (tmp_path / "idempotency.db").exists()


def test_the_channel_declaration_shown_is_the_webhook_channels(tmp_path: Path):
    from sender import webhook

    shown = load("channel-declaration", tmp_path)["CHANNEL"]
    for field in ("name", "spec", "needs_secret", "secret_form", "new_secret", "check_payload"):
        assert getattr(shown, field) == getattr(webhook.CHANNEL, field), field
    assert isinstance(shown.open(4), webhook.WebhookChannel)


def test_the_retry_schedule_example_registers_the_schedule_and_the_max_age_it_shows(tmp_path: Path):
    block = shell_block_after("### Retry schedule")
    shown = bash(f"outbox migrate >/dev/null\n{block}", tmp_path)
    assert "retry_schedule         [5, 30, 300, 1800, 3600]" in shown
    assert "max_age_seconds        86400" in shown


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


def test_the_kafka_example_runs_on_the_local_broker_the_readme_starts(tmp_path: Path):
    """The local try: install noida-db, start its broker in the background, run the example, stop
    the broker; as printed, on a port of this run's."""
    block = shell_block_after("### Kafka")
    assert "noida-db up --only kafka --kafka-port 9092" in block and "python kafka_example.py" in block
    port = free_port()
    (tmp_path / "kafka_example.py").write_text(python_blocks()["kafka"].replace("127.0.0.1:9092", f"127.0.0.1:{port}"))
    try:
        shown = bash(block.replace("9092", str(port)), tmp_path)
        assert not listening(port), "noida-db down left the broker running"
    finally:
        if listening(port):
            subprocess.run([str(VENV_BIN / "noida-db"), "down"], cwd=tmp_path, capture_output=True, timeout=30)
    status, record = [line for line in shown.splitlines() if line.startswith(("delivered", "b'"))]
    assert status == "delivered orders/0/0"
    key, value, headers = record.split(" ", 2)
    assert (key, value) == ("b'order-42'", """b'{"event":"paid","order":42}'""")
    assert "'idempotency-key': b'acme/order-42-paid'" in headers and "'outbox-fence': b'1'" in headers
    assert "'webhook-signature': b'v1," in headers


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


def test_the_http_walkthrough_delivers_to_the_fastapi_receiver_it_starts(tmp_path: Path):
    """Over HTTP, as printed: the FastAPI example saved as receiver.py and started with the
    README's uvicorn command, `outbox serve` in a directory of its own, and the walkthrough's
    commands run there by bash, then the Python client example as the README runs it after them;
    only the admin token and the ports are this run's."""
    from .test_service import Service

    receiving, serving = tmp_path / "receiver", tmp_path / "outbox"
    receiving.mkdir()
    serving.mkdir()
    (receiving / "receiver.py").write_text(python_blocks()["fastapi-receiver"])
    start_receiver = shell_block_after("### Over HTTP")
    assert "uvicorn receiver:app --port 9000" in start_receiver
    port = free_port()
    with started(start_receiver.replace("--port 9000", f"--port {port}"), receiving, port) as receiver_log:
        service = Service(serving)
        try:
            admin = service.first_admin_token()
            assert admin is not None

            def run(block: str) -> str:
                return bash(exported + "\n" + block.replace("ADMIN=obx_...", f"ADMIN={admin}")
                            .replace("localhost:8080", f"127.0.0.1:{service.port}")
                            .replace("127.0.0.1:9000", f"127.0.0.1:{port}"), serving)

            exported = ""
            enqueue = shell_block_after("### Over HTTP", 1)
            assert '"url": "http://127.0.0.1:9000/webhooks/billing"' in enqueue  # the path the receiver serves
            shown = run(enqueue + '\necho; echo "PRODUCER=$PRODUCER"')
            assert "HTTP/1.1 201 Created" in shown and '"status":"pending"' in shown
            exported = next(line for line in shown.splitlines() if line.startswith("PRODUCER="))
            read_back = run(shell_block_after("### Over HTTP", 2))
            assert '"action_id":"invoice-42-send"' in read_back
            settled = json.loads(run(shell_block_after("### Learning the outcome")))
            client = python_blocks()["client"].replace("127.0.0.1:8080", f"127.0.0.1:{service.port}")
            (serving / "client_example.py").write_text(client)
            from_python = run(shell_block_after("### From another host: the Python client")).splitlines()
        finally:
            service.stop()
        logged = receiver_log.read_text()
    assert settled["status"] == "delivered" and settled["settled"] is True
    [attempt] = settled["attempts"]
    assert (attempt["status_code"], attempt["external_id"]) == (200, "inv-1")  # the example's handler, once
    assert '"POST /webhooks/billing HTTP/1.1" 200' in logged
    assert from_python == ["already enqueued delivered", "10 of 10 accepted", "refused: 409 intent-conflict",
                           "delivered [('submitted', 'delivered')]"]
    assert (receiving / "idempotency.db").exists()


def test_the_flow_control_example_sets_the_limits_it_shows(tmp_path: Path):
    shown = dict(line.split(None, 1) for line in bash(shell_block_after("### Flow control"), tmp_path).splitlines()
                 if re.match(r"(rate_limit|max_in_flight|paused_until) ", line))
    assert json.loads(shown["rate_limit"]) == {"per_second": 5, "burst": 10}
    assert shown["max_in_flight"] == "4" and shown["paused_until"] == "-"


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


def test_the_status_names_every_channel_as_here_today_and_the_changelog_every_migration():
    status = re.search(r"> \*\*Status\.\*\*(.*?)\n\n", README.read_text(), re.S)
    assert status is not None
    today, _, coming = " ".join(status.group(1).replace("> ", "").split()).partition("Next:")
    for channel in entry_points(group="outbox.channels"):
        assert channel.name in today.lower() and channel.name not in coming.lower(), channel.name
    listed = re.search(r"migrations (\d{4})–(\d{4})", CHANGELOG.read_text())
    assert listed is not None
    for dialect in ("sqlite", "postgres"):
        shipped = [m.version for m in scripts_for(dialect)]
        assert (int(listed.group(1)), int(listed.group(2))) == (shipped[0], shipped[-1]), dialect


def test_every_benchmark_the_readme_lists_takes_quick():
    text = README.read_text()
    section = text[text.index("## Performance"):text.index("## Layout")]
    assert "Each takes `--quick`." in section
    scripts = sorted(set(re.findall(r"`python (tests/bench/\w+\.py)`", section)))
    assert len(scripts) >= 6
    helps = {script: subprocess.Popen([sys.executable, script, "--help"], cwd=README.parent, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for script in scripts}
    for script, running in helps.items():
        out, err = running.communicate(timeout=60)
        assert running.returncode == 0 and "--quick" in out, (script, err)
