"""What tracing costs a delivery: bench_delivery's drain of N intents to a loopback receiver
(SQLite, the worker at its default concurrency) with tracing off, as it runs without an SDK
(the API's no-op spans), against the same with the SDK recording every span through a
BatchSpanProcessor into an InMemorySpanExporter. Same run, same receiver, the two modes
alternating round by round; medians of rounds, and the cost per delivery as the difference.

The global tracer provider can be set only once per process, so the one set here is a switch:
off, its tracers are the API's no-op ones (what ``opentelemetry-api`` alone gives); on, the
SDK's. The intents are enqueued untimed, in the mode of their round (so an intent traced on
carries a create span's context and its send span is that span's child, as in production).

On a tree without tracing (before ``outbox.tracing``), both modes run the same code and the
ratio is ~1.00; compare that run's "off" rate with this one's to see the API's own cost. The
SDK is needed for the "on" rounds (``pip install 'outbox-delivery[tracing]'``, or the test
extra); without it only "off" is measured.

    python tests/bench/bench_tracing.py [--n N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_delivery import outbox_delivery, running_receiver
from harness import BenchError
from opentelemetry import trace

_on = False


def switch() -> Any:
    """Install a provider whose tracers are the SDK's while ``_on``, the API's no-op ones
    otherwise; returns the exporter the SDK's spans reach (None without the SDK)."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        return None
    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 20))  # every span kept, none dropped
    noop = trace.NoOpTracer()

    class Switched(trace.Tracer):
        def __init__(self, real: trace.Tracer) -> None:
            self.real = real

        def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
            return (self.real if _on else noop).start_span(*args, **kwargs)

        def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
            return (self.real if _on else noop).start_as_current_span(*args, **kwargs)

    class Provider(trace.TracerProvider):
        def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
            return Switched(sdk.get_tracer(*args, **kwargs))

    trace.set_tracer_provider(Provider())
    exporter.flush = sdk.force_flush  # type: ignore[attr-defined]
    return exporter


async def run(args: argparse.Namespace) -> int:
    global _on
    exporter = switch()
    modes = ["off", "on"] if exporter is not None else ["off"]
    if exporter is None:
        print("opentelemetry-sdk is not installed: measuring tracing off only", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    spans: list[int] = []
    try:
        async with running_receiver(root) as receiver:
            for round_ in range(args.rounds):
                for mode in modes if round_ % 2 == 0 else modes[::-1]:
                    workdir = root / f"{mode}-{round_}"
                    workdir.mkdir()
                    _on = mode == "on"
                    if exporter is not None:
                        exporter.clear()
                    try:
                        delivery = await outbox_delivery(workdir, receiver, args.n)
                    finally:
                        _on = False
                    if mode == "on":
                        exporter.flush()
                        spans.append(len(exporter.get_finished_spans()))
                    rates[mode].append(delivery.rate)
                    shutil.rmtree(workdir)
                    print(f"  round {round_ + 1} {mode:>3}: {delivery.rate:8.0f} deliveries/s", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    off = statistics.median(rates["off"])
    print(f"\ndelivery of {args.n} intents to a loopback receiver (SQLite), median of {args.rounds} rounds")
    print(f"  tracing off (API only)       {off:8.0f} deliveries/s   {1e6 / off:7.1f} µs per delivery   1.00")
    if "on" in rates:
        on = statistics.median(rates["on"])
        print(f"  SDK, BatchSpanProcessor      {on:8.0f} deliveries/s   {1e6 / on:7.1f} µs per delivery   "
              f"{on / off:.2f}")
        print(f"  cost per delivery: {1e6 / on - 1e6 / off:+.1f} µs; spans recorded per round: "
              f"{', '.join(map(str, spans))} (a create and a send per intent: {2 * args.n})")
        if any(count < 2 * args.n for count in spans):
            raise BenchError("the SDK did not record a create and a send span for every intent")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000, help="intents per round [default: 5000]")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each mode [default: 5]")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except BenchError as exc:
        print(f"invalid measurement: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
