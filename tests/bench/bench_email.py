"""Durable email delivery throughput, as a ratio to a bare SMTP client loop from the same run.

Every delivery is recorded before and after it is made, each write committed to SQLite, and the
message is handed over on one of the destination's reused SMTP connections with the channel's
own stage accounting (MAIL, RCPT, DATA, the message, its reply). Absolute rates say more about
the machine than the library, so the same SMTP server is first driven by a bare aiosmtplib loop
at the same concurrency (the SMTP ceiling of this machine), and the worker's rate is reported
as a ratio to it:

1. a sink in its own process: aiosmtpd's Controller on a uvloop loop, answering
   ``250 2.0.0 Ok: queued as N`` to every message and counting messages and bytes per envelope
   sender; ``NOOP counts`` answers the counts as JSON;
2. baseline: CONCURRENCY aiosmtplib connections, each reused, sending N messages with
   ``SMTP.sendmail`` (after untimed warm-up messages): one message, built beforehand as the
   channel builds one (the same headers, identity headers included, and text body), sent N
   times (the average size of each loop's messages at the sink is printed, to show they match);
3. the outbox: N intents for an email destination (``connections=CONCURRENCY``, tls none)
   enqueued into a fresh SQLite file (untimed), then ``sender.Worker`` with
   ``worker_concurrency=CONCURRENCY`` and ``authority="allow-all"``, timed until every intent
   is delivered; the sink must have counted exactly N messages from it and the store must hold N
   delivered intents and N attempts. The worker opens its connections within the timed run (the
   bare loop opens its own untimed), as a fresh worker would;
4. apart, where the worker's time goes: the email channel alone (``EmailChannel.send`` from
   CONCURRENCY tasks, no store, after untimed warm-up messages that open its connections), each
   message built for its intent as the worker's are: the channel's own ceiling.

Printed per round and as medians: messages per second of both loops, the ratio, and CPU time
per message of this process (event loop and SQLite writer thread) and of the sink. The target is
printed beside the ratio; nothing here asserts on timing. The exit status is non-zero only when
a measurement is invalid (a failed send, an undelivered intent, a wrong count, a dead sink).

    python tests/bench/bench_email.py [--n N] [--rounds R] [--concurrency C] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import aiosmtplib
import harness
from bench_delivery import Cpu, check_delivered, fill, own_cpu, progress, time_worker
from harness import BenchError

CONCURRENCY = 16
DESTINATION = "mail"
SCOPE = "acme"
#: Envelope senders: the sink counts each loop's messages apart.
BASELINE_FROM = "baseline@bench.example"
OUTBOX_FROM = "outbox@bench.example"
ALONE_FROM = "channel@bench.example"
TO = "ann@example.org"
SUBJECT = "Your receipt"
TEXT = "Thank you for your order. " * 3
PAYLOAD = {"to": [TO], "subject": SUBJECT, "text": TEXT}
#: Untimed messages per connection before the bare loop's timed ones (fewer left its first round slow).
WARMUP_PER_CONNECTION = 32
SMTP_TIMEOUT_SECONDS = 30.0


# -- the sink (its own process) ----------------------------------------------------------------


def serve_sink(port: int) -> None:
    """aiosmtpd's Controller on 127.0.0.1:port, its loop uvloop, until SIGTERM."""
    import uvloop
    from aiosmtpd.controller import Controller

    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            counts[envelope.mail_from] += 1
            sizes[envelope.mail_from] += len(envelope.content)
            return f"250 2.0.0 Ok: queued as {counts.total()}"

        async def handle_NOOP(self, server: Any, session: Any, envelope: Any, arg: str) -> str:
            return "250 " + json.dumps({"counts": counts, "bytes": sizes}) if arg == "counts" else "250 OK"

    controller = Controller(Handler(), hostname="127.0.0.1", port=port, loop=uvloop.new_event_loop())
    controller.start()
    print(f"sink listening on 127.0.0.1:{port}", flush=True)
    signal.pause()  # SIGTERM ends the process


@dataclass
class Sink:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def cpu(self) -> tuple[float, float | None]:
        """(this process's CPU seconds, the sink's)."""
        return own_cpu(), harness.process_cpu(self.proc.pid)

    def alive(self) -> None:
        harness.check_alive(self.proc, self.log, "the sink")

    def client(self) -> aiosmtplib.SMTP:
        return aiosmtplib.SMTP(hostname="127.0.0.1", port=self.port, use_tls=False, start_tls=False,
                               timeout=SMTP_TIMEOUT_SECONDS)

    async def counts(self) -> tuple[Counter[str], Counter[str]]:
        """(messages, bytes) received so far, by envelope sender."""
        self.alive()
        async with self.client() as client:
            reply = await client.execute_command(b"NOOP", b"counts")
        if reply.code != 250:
            raise BenchError(f"NOOP counts answered {reply.code} {reply.message}")
        got = json.loads(reply.message)
        return Counter(got["counts"]), Counter(got["bytes"])

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + harness.SERVER_START_SECONDS
        while True:
            try:
                await self.counts()
                return
            except (OSError, aiosmtplib.SMTPException):
                if time.monotonic() > deadline:
                    raise BenchError(f"the sink did not answer in {harness.SERVER_START_SECONDS:.0f} s:\n"
                                     f"{harness.log_tail(self.log)}") from None
            await asyncio.sleep(0.05)


# -- the two loops ----------------------------------------------------------------------------


@dataclass
class Run:
    rate: float  # messages per second
    cpu: Cpu


def message() -> bytes:
    """A message like the one the channel builds for an intent (the same headers), built once."""
    from outbox.digest import payload_digest
    from outbox.ids import intent_key, uuid7
    from receivers import wire
    from sender.email import message_id

    key = intent_key(SCOPE, uuid7())
    built = EmailMessage(policy=policy.SMTP.clone(max_line_length=998))
    built["From"] = BASELINE_FROM
    built["To"] = TO
    built["Subject"] = SUBJECT
    built["Date"] = format_datetime(datetime.now(UTC))
    built["Message-ID"] = message_id(key, BASELINE_FROM)
    built[wire.IDEMPOTENCY_KEY] = key
    built[wire.PAYLOAD_DIGEST] = payload_digest(PAYLOAD)
    built[wire.ATTEMPT_ID] = uuid7()
    built[wire.FENCE] = "1"
    built.set_content(TEXT)
    return built.as_bytes()


async def baseline(sink: Sink, n: int, concurrency: int) -> Run:
    """A bare aiosmtplib loop: ``concurrency`` connections, each reused, n timed messages."""
    warmup = WARMUP_PER_CONNECTION * concurrency
    body = message()
    idle = [sink.client() for _ in range(concurrency)]
    failures: Counter[str] = Counter()

    async def one(i: int) -> bool:
        client = idle.pop()
        try:
            refused, _ = await client.sendmail(BASELINE_FROM, [TO], body)
            return not refused
        except (OSError, aiosmtplib.SMTPException) as exc:
            failures[f"{type(exc).__name__}: {exc}"] += 1
            return False
        finally:
            idle.append(client)

    try:
        await asyncio.gather(*(client.connect() for client in idle))
        await harness.fan_out(concurrency, 0, warmup, one)
        cpu = sink.cpu()
        ok, seconds = await harness.fan_out(concurrency, warmup, warmup + n, one)
        used = Cpu.measure(cpu, sink.cpu(), n)
    finally:
        for client in idle:
            client.close()
    if ok != n or failures:
        raise BenchError(f"baseline: {n - ok} of {n} messages failed: {dict(failures)}")
    return Run(n / seconds, used)


async def outbox_delivery(workdir: Path, sink: Sink, n: int, concurrency: int) -> Run:
    """Enqueue n intents (untimed), run a Worker until every one is delivered, check the counts."""
    from outbox import Outbox, Settings
    from sender import Worker
    from sender.email import EmailSpec

    before = (await sink.counts())[0][OUTBOX_FROM]
    settings = Settings(authority="allow-all", worker_concurrency=concurrency, poll_seconds=0.1)
    async with await Outbox.open(f"sqlite:///{workdir / 'outbox.db'}", settings=settings) as box:
        await box.put_destination(DESTINATION, EmailSpec.model_validate({
            "channel": "email", "host": "127.0.0.1", "port": sink.port, "tls": "none", "allow_insecure": True,
            "allow_private_network": True, "from": OUTBOX_FROM, "connections": concurrency}))
        await fill(box, 0, n, lambda _: {"destination": DESTINATION, "scope": SCOPE, "payload": PAYLOAD})
        seconds, _, used = await time_worker(box, Worker(box, concurrency=concurrency), n, sink)
        await check_delivered(box, n)
    received = (await sink.counts())[0][OUTBOX_FROM] - before
    if received != n:
        raise BenchError(f"the sink counted {received} messages from the outbox, expected exactly {n}")
    return Run(n / seconds, used)


async def channel_alone(sink: Sink, n: int, concurrency: int) -> Run:
    """``EmailChannel.send`` with no store around it: ``concurrency`` sends at once on one
    channel, each an intent like the worker's (the channel's own ceiling)."""
    from outbox import Destination, Intent, OnUnknown, Status
    from outbox.digest import canonical_json, payload_digest
    from outbox.ids import uuid7
    from sender.email import EmailChannel, EmailSpec

    now = datetime.now(UTC)
    spec = EmailSpec.model_validate({
        "channel": "email", "host": "127.0.0.1", "port": sink.port, "tls": "none", "allow_insecure": True,
        "allow_private_network": True, "from": ALONE_FROM, "connections": concurrency})
    destination = Destination(
        id=DESTINATION, channel="email", settings=spec.settings(), secrets=(), idempotent=False,
        retention_seconds=86_400, on_unknown=OnUnknown.NEVER, timeout_seconds=SMTP_TIMEOUT_SECONDS,
        requires_approval=False, allow_private_network=True, disabled=False, created_at=now, updated_at=now)
    body, digest = canonical_json(PAYLOAD).decode(), payload_digest(PAYLOAD)
    warmup = WARMUP_PER_CONNECTION * concurrency
    intents = [Intent(seq=i + 1, action_id=uuid7(), scope=SCOPE, destination=DESTINATION, channel="email",
                      payload_json=body, payload_digest=digest, status=Status.LEASED, attempts=0, max_attempts=10,
                      next_attempt_at=now, not_before=None, expires_at=None, lease_owner="bench",
                      lease_expires_at=now, fence=1, created_at=now, updated_at=now, last_error=None)
               for i in range(warmup + n)]
    channel = EmailChannel()
    one, failures = harness.channel_sends(channel, destination, intents)
    try:
        await harness.fan_out(concurrency, 0, warmup, one)
        cpu = sink.cpu()
        ok, seconds = await harness.fan_out(concurrency, warmup, warmup + n, one)
        used = Cpu.measure(cpu, sink.cpu(), n)
    finally:
        await channel.aclose()
    if ok != n or failures:
        raise BenchError(f"channel alone: {n - ok} of {n} messages failed: {dict(failures)}")
    return Run(n / seconds, used)


# -- running and reporting ---------------------------------------------------------------------


def cpu_text(cpu: Cpu) -> str:
    sink = "?" if cpu.receiver_us is None else f"{cpu.receiver_us:,.0f}"
    return f"CPU/msg {cpu.own_us:,.0f} us here, {sink} us sink"


def median_us(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):,.0f}" if known else ""


async def run(args: argparse.Namespace) -> int:
    n = args.n or (300 if args.quick else 2_000)
    rounds = args.rounds or (1 if args.quick else 3)
    concurrency = args.concurrency
    problems: list[str] = []
    began = time.perf_counter()
    print(f"email benchmark (N={n:,} messages per round, {rounds} round{'s' * (rounds > 1)}, "
          f"{concurrency} connections; store WAL, synchronous=FULL (its default))")
    print(f"{harness.machine_summary()}, worker and client on the asyncio loop, sink aiosmtpd+uvloop "
          "in its own process\n", flush=True)

    bases: list[Run] = []
    outs: list[Run] = []
    ratios: list[float] = []
    alones: list[Run] = []
    alone_ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-email-") as tmp:
        root = Path(tmp)
        port = harness.free_port()
        log = root / "sink.log"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-sink", str(port)]
        with harness.serving(cmd, cwd=root, log=log) as proc:
            sink = Sink(proc, port, log)
            await sink.wait_ready()
            for round_ in range(1, rounds + 1):
                workdir = harness.fresh_dir(root, "round")
                try:
                    base = await baseline(sink, n, concurrency)
                    progress(f"round {round_}", f"bare aiosmtplib, {concurrency} connections",
                             f"{base.rate:>7,.0f} msg/s; {cpu_text(base.cpu)}")
                    out = await outbox_delivery(workdir, sink, n, concurrency)
                    progress(f"round {round_}", f"outbox Worker, {concurrency} connections",
                             f"{out.rate:>7,.0f} msg/s ({out.rate / base.rate:.2f}x); {cpu_text(out.cpu)}")
                    alone = await channel_alone(sink, n, concurrency)
                    progress(f"round {round_}", "email channel alone, no store",
                             f"{alone.rate:>7,.0f} msg/s ({alone.rate / base.rate:.2f}x); {cpu_text(alone.cpu)}")
                    bases.append(base)
                    outs.append(out)
                    ratios.append(out.rate / base.rate)
                    alones.append(alone)
                    alone_ratios.append(alone.rate / base.rate)
                except BenchError as exc:
                    problems.append(f"round {round_}: {exc}")
                    print(f"round {round_}: FAILED: {exc}", flush=True)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
            counts, sizes = await sink.counts()

    print(f"\nemail benchmark (N={n:,}; median of {rounds} round{'s' * (rounds > 1)}, ratio per round "
          "against the bare client; CPU per message in microseconds)")
    lines = [("case", "msg/s", "ratio", "spread", "CPU here", "CPU sink", "target", "")]
    if bases:
        lines.append((f"bare aiosmtplib -> sink ({concurrency} connections)",
                      f"{statistics.median(b.rate for b in bases):,.0f}", "1.00x", "",
                      median_us([b.cpu.own_us for b in bases]), median_us([b.cpu.receiver_us for b in bases]),
                      "", ""))
    if outs:
        median, spread = harness.fmt_ratio(ratios)
        lines.append((f"outbox Worker, durable email ({concurrency} connections)",
                      f"{statistics.median(o.rate for o in outs):,.0f}", median, spread,
                      median_us([o.cpu.own_us for o in outs]), median_us([o.cpu.receiver_us for o in outs]),
                      ">= 0.4x", "met" if statistics.median(ratios) >= 0.4 else "NOT MET"))
    if alones:
        median, spread = harness.fmt_ratio(alone_ratios)
        lines.append(("  apart: the email channel alone, no store", f"{statistics.median(a.rate for a in alones):,.0f}",
                      median, spread, median_us([a.cpu.own_us for a in alones]),
                      median_us([a.cpu.receiver_us for a in alones]), "", ""))
    print(harness.render_table(lines, right={1, 2, 4, 5}))
    if counts[BASELINE_FROM] and counts[OUTBOX_FROM]:
        print(f"message size at the sink: bare client {sizes[BASELINE_FROM] / counts[BASELINE_FROM]:,.0f} bytes, "
              f"outbox {sizes[OUTBOX_FROM] / counts[OUTBOX_FROM]:,.0f} bytes on average")
    return harness.finish(began, problems)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness.new_parser(__doc__)
    add = parser.add_argument
    add("--n", type=int, help="messages per loop per round (2,000; --quick 300)")
    add("--rounds", type=int, help="rounds, each the bare client then the outbox (3; --quick 1)")
    add("--concurrency", type=int, default=CONCURRENCY, help=f"SMTP connections of both loops ({CONCURRENCY})")
    add("--quick", action="store_true", help="a short run: N=300, one round")
    add("--serve-sink", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    harness.require_positive(parser, args, ("n", "rounds", "concurrency"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_sink is not None:
        serve_sink(args.serve_sink)
        return 0
    return harness.run_main(run(args), uvloop=False)


if __name__ == "__main__":
    sys.exit(main())
