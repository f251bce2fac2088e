"""Per-destination circuit breakers: pause a receiver that stops answering, probe it, resume."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from outbox import Destination, OnUnknown, Outcome, Submission
from sender.channel import SendResult
from sender.circuit import Circuits

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def destination(name: str, url: str = "https://receiver.example/hook") -> Destination:
    return Destination(name, "webhook", {"url": url}, ("whsec_x",), True, 86_400, OnUnknown.DECLARED, 10.0,
                       False, False, False, T0, T0)


D, OTHER = destination("d"), destination("other")
REFUSED = SendResult(Submission.NOT_SUBMITTED, Outcome.RETRYABLE, error="ClientConnectorError: refused")
TIMED_OUT = SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error="TimeoutError")
ANSWERED_503 = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, status_code=503, error="receiver answered 503",
                          answered=True)
SSRF = SendResult(Submission.NOT_SUBMITTED, Outcome.REJECTED, error="refused: 10.0.0.1 is not a public address")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_it_opens_after_the_threshold_and_holds_sends_spread_over_the_pause():
    circuits = Circuits(3, 10.0)
    assert circuits.record(D, REFUSED, at(0)) is None
    assert circuits.record(D, TIMED_OUT, at(1)) is None
    assert circuits.hold(D, at(1)) is None  # still closed
    level, message = circuits.record(D, REFUSED, at(2))
    assert level == logging.WARNING and "stopped answering (3 sends in a row" in message and "10s" in message
    dues = []
    for _ in range(50):
        due, why = circuits.hold(D, at(3))
        dues.append(due)
        assert "'d' is not answering" in why and at(12).isoformat() in why
    assert min(dues) >= at(12) and max(dues) <= at(22) and len(set(dues)) > 1
    assert circuits.hold(OTHER, at(3)) is None  # one destination's silence pauses only it


def test_answers_of_any_status_and_our_own_refusals_do_not_count_as_silence():
    circuits = Circuits(2, 10.0)
    circuits.record(D, REFUSED, at(0))
    circuits.record(D, ANSWERED_503, at(1))  # it answered: the run of silence is over
    circuits.record(D, REFUSED, at(2))
    assert circuits.hold(D, at(2)) is None
    circuits.record(D, SSRF, at(3))  # refused by us, not by the receiver
    assert circuits.hold(D, at(3)) is None
    assert Circuits(0, 10.0).record(D, REFUSED, at(0)) is None  # 0: never pause


def test_the_channel_says_whether_the_receiver_answered_not_the_http_status():
    """An answer without an HTTP status (an SMTP server's 451, a broker's error) ends a run of
    silence too: the channel says it answered."""
    smtp_451 = SendResult(Submission.SUBMITTED, Outcome.RETRYABLE, error="451 try again later", answered=True)
    circuits = Circuits(2, 10.0)
    circuits.record(D, REFUSED, at(0))
    circuits.record(D, smtp_451, at(1))
    circuits.record(D, REFUSED, at(2))
    assert circuits.hold(D, at(2)) is None


def test_late_failures_of_sends_already_in_flight_do_not_extend_the_pause():
    circuits = Circuits(2, 10.0)
    circuits.record(D, REFUSED, at(0))
    circuits.record(D, REFUSED, at(0))
    assert circuits.record(D, TIMED_OUT, at(5)) is None
    assert circuits.hold(D, at(9)) is not None and circuits.hold(D, at(10)) is None


def test_after_the_pause_one_send_probes_a_failed_probe_doubles_the_pause_and_an_answer_closes_it():
    circuits = Circuits(2, 10.0)
    circuits.record(D, REFUSED, at(0))
    circuits.record(D, REFUSED, at(0))
    assert circuits.hold(D, at(10)) is None  # the probe
    assert circuits.hold(D, at(10.5)) is not None  # the others wait for its answer
    level, message = circuits.record(D, TIMED_OUT, at(11))
    assert level == logging.WARNING and "paused for 20s" in message
    assert circuits.hold(D, at(30)) is not None and circuits.hold(D, at(31)) is None  # the next probe
    level, message = circuits.record(D, ANSWERED_503, at(31.5))
    assert level == logging.INFO and "'d' answers again" in message
    assert circuits.hold(D, at(32)) is None and circuits.hold(D, at(32)) is None


def test_a_probe_that_never_reports_back_is_replaced_after_a_pause():
    circuits = Circuits(1, 10.0)
    circuits.record(D, REFUSED, at(0))
    assert circuits.hold(D, at(10)) is None  # a probe, whose send then never happened
    assert circuits.hold(D, at(15)) is not None
    assert circuits.hold(D, at(20)) is None  # another probe


def test_pauses_stop_growing_at_the_longest():
    circuits = Circuits(1, 100.0, max_pause_seconds=300.0)
    now = at(0)
    for _ in range(5):
        _, message = circuits.record(D, REFUSED, now)
        now += timedelta(seconds=1000)
        assert circuits.hold(D, now) is None
    assert message.endswith("paused for 300s")


def test_a_destination_given_a_new_url_starts_afresh():
    circuits = Circuits(1, 10.0)
    circuits.record(D, REFUSED, at(0))
    assert circuits.hold(D, at(1)) is not None and circuits.paused == 1
    moved = destination("d", "https://new-home.example/hook")
    assert circuits.hold(moved, at(1)) is None  # the operator fixed it: no waiting out the pause
    assert circuits.paused == 0


def test_a_thousand_pauses_in_a_row_still_pause_for_the_longest():
    """Each pause doubles the last, up to the longest: counted without limit, the thousand and
    twenty-fifth made ``2 ** pauses`` too large for a float, and the send's outcome failed."""
    circuits = Circuits(1, 5.0, max_pause_seconds=300.0)
    now = at(0)
    for _ in range(1100):
        circuits.record(D, REFUSED, now)
        now += timedelta(seconds=301)
        assert circuits.hold(D, now) is None  # its pause is over: this send probes
    _, message = circuits.record(D, REFUSED, now)
    assert message.endswith("paused for 300s")
