"""The installed ``outbox`` command and service, driven from outside as a newcomer would."""

from __future__ import annotations

import getpass
import json
import re
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import trustme

from outbox.store.migrator import scripts_for

from ..conftest import SECRET, free_port
from ..receiver import Receiver, Reply
from .conftest import OUTBOX, clean_env

pytestmark = pytest.mark.acceptance


def cli(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([OUTBOX, *args], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


class Service:
    """``outbox serve`` in a subprocess, in a fresh directory with no configuration; over HTTPS,
    trusting ``ca``, when it is given one."""

    def __init__(self, cwd: Path, *args: str, env: dict[str, str] | None = None,
                 ca: trustme.CA | None = None) -> None:
        self.cwd = cwd
        self.port = free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.verify: ssl.SSLContext | bool = True
        if ca is not None:
            self.verify = ssl.create_default_context()
            ca.configure_trust(self.verify)
        self.log = cwd / f"serve-{self.port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([OUTBOX, "serve", "--port", str(self.port), *args], cwd=cwd,
                                         env=clean_env(**(env or {})), stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(self.url + "/readyz", timeout=1, verify=self.verify).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def first_admin_token(self) -> str | None:
        tokens = [w for w in self.log.read_text().split() if w.startswith("obx_")]
        return tokens[0] if tokens else None

    def stop(self) -> None:
        """SIGTERM, and check the service shut down gracefully (uvicorn re-raises the signal)."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=15) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in self.log.read_text()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def service(workdir: Path) -> Iterator[Service]:
    """The API alone (--no-worker): intents stay as the producer left them."""
    svc = Service(workdir, "--no-worker")
    yield svc
    if svc.proc.poll() is None:
        svc.proc.kill()
        svc.proc.wait()


def test_first_start_prints_one_admin_token_and_a_restart_prints_none(workdir: Path, service: Service):
    admin = service.first_admin_token()
    assert admin is not None
    assert (workdir / "outbox.db").exists()
    r = httpx.get(service.url + "/v1/destinations", headers={"Authorization": f"Bearer {admin}"})
    assert r.status_code == 200
    service.stop()
    again = Service(workdir, "--no-worker")
    try:
        assert again.first_admin_token() is None
        listed = json.loads(cli(workdir, "--json", "tokens", "list").stdout)
        assert [t["role"] for t in listed] == ["admin"]
    finally:
        again.stop()


def test_a_producer_enqueues_over_http_and_an_operator_reads_with_the_cli(workdir: Path, service: Service):
    admin = {"Authorization": f"Bearer {service.first_admin_token()}"}
    put = httpx.put(service.url + "/v1/destinations/billing", headers=admin,
                    json={"url": "https://billing.example/hook", "secret": SECRET})
    assert put.status_code == 201 and "whsec_" not in put.text
    producer = json.loads(cli(workdir, "--json", "tokens", "create", "--role", "producer",
                              "--scope", "acme").stdout)["token"]
    auth = {"Authorization": f"Bearer {producer}"}
    body = {"action_id": "order-7", "scope": "acme", "destination": "billing", "payload": {"order": 7}}
    assert httpx.post(service.url + "/v1/intents", headers=auth, json=body).status_code == 201
    assert httpx.post(service.url + "/v1/intents", headers=auth, json=body).status_code == 200

    shown = json.loads(cli(workdir, "--json", "show", "order-7").stdout)
    assert shown["status"] == "pending" and shown["payload"] == {"order": 7}
    assert [e["kind"] for e in shown["events"]] == ["enqueued"]

    enq = cli(workdir, "--json", "enqueue", "--destination", "billing", "--scope", "acme",
              "--payload", '{"order": 8}', "--action-id", "order-8")
    assert json.loads(enq.stdout)["created"] is True
    over_http = httpx.get(service.url + "/v1/intents/order-8", headers=auth).json()
    assert over_http["events"][0]["actor"] == f"cli:{getpass.getuser()}"  # as for operators' actions

    listed = json.loads(cli(workdir, "--json", "list", "--status", "pending").stdout)
    assert [i["action_id"] for i in listed["items"]] == ["order-8", "order-7"]
    text = cli(workdir, "list").stdout
    assert "order-7" in text and "pending" in text


def test_json_logs_make_every_line_of_the_service_one_object(workdir: Path):
    cli(workdir, "migrate")  # only serve, worker and migrate make the database
    cli(workdir, "tokens", "create", "--role", "admin")  # so no first-start token is printed
    svc = Service(workdir, env={"OUTBOX_LOG_FORMAT": "json"})
    try:
        assert httpx.get(svc.url + "/healthz").status_code == 200
    finally:
        svc.stop()
    records = [json.loads(line) for line in svc.log.read_text().splitlines()]
    by_logger = {r["logger"] for r in records}
    assert {"uvicorn.error", "uvicorn.access", "outbox.sender"} <= by_logger
    assert any(r["logger"] == "uvicorn.access" and "/healthz" in r["message"] for r in records)
    assert not any("\x1b" in json.dumps(r, ensure_ascii=False) for r in records)  # no terminal colours


def test_sigterm_answers_long_polls_and_stops_the_sender_at_once(workdir: Path, receiver: Receiver):
    receiver.script("/hook", Reply(503))  # the intent keeps being retried: never settled
    cli(workdir, "migrate")
    cli(workdir, "destinations", "put", "hook", "--url", f"{receiver.url}/hook", "--allow-private-network")
    cli(workdir, "enqueue", "--destination", "hook", "--scope", "acme", "--payload", "{}", "--action-id", "a1")
    admin = json.loads(cli(workdir, "--json", "tokens", "create", "--role", "admin").stdout)["token"]
    svc = Service(workdir, env={"OUTBOX_AUTHORITY": "allow-all"})  # retries 0.5-1 s apart
    connected = threading.Event()

    def long_poll() -> httpx.Response:
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {admin}"}, timeout=70) as c:
            c.get("/healthz")  # the server has accepted this connection; the poll reuses it
            connected.set()
            return c.get("/v1/intents/a1", params={"wait": 60})

    try:
        with ThreadPoolExecutor(1) as pool:
            poll = pool.submit(long_poll)
            receiver.wait_for_requests_blocking(1, "/hook", timeout=20)  # the sender is busy with it
            assert connected.wait(20)
            time.sleep(0.5)  # the poll's request is read and waiting
            signalled = time.monotonic()
            svc.proc.send_signal(signal.SIGTERM)
            answer = poll.result(timeout=70)
            assert time.monotonic() - signalled < 5  # not the minute the poll asked for
            assert answer.status_code == 200 and answer.json()["status"] == "pending"
            assert svc.proc.wait(timeout=15) in (0, -signal.SIGTERM)
        assert time.monotonic() - signalled < 10
        sent = len(receiver.requests("/hook"))
        time.sleep(1.5)  # past the next retry's time
        assert len(receiver.requests("/hook")) == sent  # nothing more was claimed or sent
        assert "Application shutdown complete" in svc.log.read_text()
    finally:
        if svc.proc.poll() is None:
            svc.proc.kill()


def _console_cookie(svc: Service, token: str, **headers: str) -> str:
    """The session's Set-Cookie of signing in to ``svc``'s console with ``token``."""
    with httpx.Client(base_url=svc.url, verify=svc.verify, timeout=10, headers=headers) as http:
        form = http.get("/console/login")
        value = re.search(r"name='csrf' value='([^']+)'", form.text)
        assert value is not None, form.text
        signed = http.post("/console/login", data={"token": token, "csrf": value.group(1)},
                           headers={"Cookie": f"outbox_console_login={form.cookies['outbox_console_login']}"})
    assert signed.status_code == 303 and signed.headers["location"] == "/console", signed.text
    return next(c for c in signed.headers.get_list("set-cookie") if c.startswith("outbox_console="))


def test_serve_speaks_tls_with_the_certificate_it_is_given(workdir: Path):
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(workdir / "cert.pem")
    issued.private_key_pem.write_to_path(workdir / "key.pem")
    cli(workdir, "migrate")
    admin = json.loads(cli(workdir, "--json", "tokens", "create", "--role", "admin").stdout)["token"]
    svc = Service(workdir, "--no-worker", "--tls-certfile", "cert.pem", "--tls-keyfile", "key.pem", ca=ca)
    try:
        assert "secure" in [part.strip().lower() for part in _console_cookie(svc, admin).split(";")]
        with pytest.raises(httpx.TransportError):  # nothing answers plain HTTP there
            httpx.get(f"http://127.0.0.1:{svc.port}/healthz", timeout=5)
    finally:
        svc.stop()
    unusable = subprocess.run([OUTBOX, "serve", "--port", str(free_port()), "--tls-certfile", "key.pem"],
                              cwd=workdir, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert unusable.returncode == 1
    assert "cannot serve TLS with key.pem: they are not a PEM certificate chain and its private key" in unusable.stderr
    alone = subprocess.run([OUTBOX, "serve", "--tls-keyfile", "key.pem"], cwd=workdir, env=clean_env(),
                           capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2 and "a TLS key needs its certificate" in alone.stderr


def test_serve_believes_x_forwarded_proto_from_the_proxies_it_is_told_of_only(workdir: Path):
    cli(workdir, "migrate")
    admin = json.loads(cli(workdir, "--json", "tokens", "create", "--role", "admin").stdout)["token"]
    proxied = {"X-Forwarded-Proto": "https"}  # sent from 127.0.0.1, as a proxy on this host would
    for args, env, secure in [((), {}, False),
                              (("--proxy-headers", "--forwarded-allow-ips", "10.0.0.0/8"), {}, False),
                              (("--proxy-headers", "--forwarded-allow-ips", "127.0.0.1"), {}, True),
                              ((), {"OUTBOX_PROXY_HEADERS": "true"}, True)]:
        svc = Service(workdir, "--no-worker", *args, env=env)
        try:
            flags = [part.strip().lower() for part in _console_cookie(svc, admin, **proxied).split(";")]
        finally:
            svc.stop()
        assert ("secure" in flags) is secure, (args, env)


def test_cli_errors_are_clear_and_exit_nonzero(workdir: Path):
    nowhere = cli(workdir, "show", "nothing-here", check=False)
    assert nowhere.returncode == 1 and "error: there is no outbox database at sqlite:///./outbox.db" in nowhere.stderr
    shipped = [m.name for m in scripts_for("sqlite")]
    assert cli(workdir, "migrate").stdout.strip() == f"applied {len(shipped)} migrations: {', '.join(shipped)}"
    missing = cli(workdir, "show", "nothing-here", check=False)
    assert missing.returncode == 1
    assert "error: intent 'nothing-here' does not exist" in missing.stderr
    bad = cli(workdir, "enqueue", "--destination", "nowhere", "--scope", "acme", "--payload", "{}",
              check=False)
    assert bad.returncode == 1 and "'nowhere' is not registered" in bad.stderr
    conflict_setup = cli(workdir, "destinations", "put", "billing", "--url", "https://b.example/")
    assert "signing secret (shown once" in conflict_setup.stdout
    cli(workdir, "enqueue", "--destination", "billing", "--scope", "acme", "--payload", '{"a": 1}',
        "--action-id", "x-1")
    clash = cli(workdir, "enqueue", "--destination", "billing", "--scope", "acme", "--payload",
                '{"a": 2}', "--action-id", "x-1", check=False)
    assert clash.returncode == 1 and "already exists" in clash.stderr
    assert cli(workdir, "migrate").stdout.strip() == "database is up to date: no migration to apply"
    assert json.loads(cli(workdir, "migrate", "--json").stdout)["applied"] == []


def test_help_names_the_environment_variable_behind_each_option(workdir: Path):
    assert "OUTBOX_DATABASE_URL" in cli(workdir, "--help").stdout
    serve_help = cli(workdir, "serve", "--help").stdout
    for name in ("OUTBOX_HOST", "OUTBOX_PORT", "OUTBOX_LOG_LEVEL", "OUTBOX_LOG_FORMAT", "OUTBOX_WORKER"):
        assert name in serve_help
    for command in (["tokens", "create"], ["enqueue"], ["show"], ["list"], ["destinations", "put"]):
        assert cli(workdir, *command, "--help").stdout.startswith("Usage: outbox")


def test_configuration_from_outbox_toml(workdir: Path):
    (workdir / "outbox.toml").write_text('database_url = "sqlite:///./from-toml.db"\n')
    cli(workdir, "migrate")
    assert (workdir / "from-toml.db").exists() and not (workdir / "outbox.db").exists()


def test_demo_delivers_on_a_fresh_machine_and_tells_each_outcome(workdir: Path):
    done = cli(workdir, "demo")
    lines = done.stdout.splitlines()
    outcome = {line.split()[0]: line.split()[1] for line in lines[lines.index("outcomes:") + 1:]}
    assert outcome == {"order-1": "delivered", "report-1": "delivered", "legacy-1": "dead",
                       "rogue-1": "revoked", "receipt-1": "delivered"}
    assert "external id rcpt-demo/order-1" in done.stdout
    assert "mail server: <demo/receipt-1@example.com> from shop@example.com to ann@example.org" in done.stdout
    assert "external id MAIL1" in done.stdout
    assert list(workdir.iterdir()) == []  # it leaves nothing behind
