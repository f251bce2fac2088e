"""What a Kafka destination must be, and how a broker's answer to a produce request is read."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from aiokafka import errors
from pydantic import ValidationError

from outbox import OnUnknown, Outcome, Submission
from sender import credentials
from sender.kafka import KafkaSpec, keep_secrets
from sender.kafka.answers import broker_refused
from sender.kafka.connections import Guard
from sender.kafka.producers import Producer
from tests.conftest import SECRET

SPEC = {"channel": "kafka", "bootstrap_servers": ["kafka.example.com:9092"], "topic": "orders"}
SASL = {**SPEC, "tls": True, "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "svc"}
NEWER, NEWEST = "whsec_" + "Tk" * 20, "whsec_" + "Tl" * 20


def refused(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as error:
        KafkaSpec.model_validate(spec)
    return [(".".join(map(str, e["loc"])), e["msg"]) for e in error.value.errors()]


def test_defaults_are_acks_all_the_idempotent_producer_and_retrying_an_unknown():
    spec = KafkaSpec.model_validate(SPEC)
    assert (spec.acks, spec.enable_idempotence, spec.on_unknown, spec.security_protocol) == (
        "all", True, OnUnknown.ALWAYS, "PLAINTEXT")
    assert spec.settings() == {"bootstrap_servers": ["kafka.example.com:9092"], "topic": "orders", "tls": False,
                               "sasl_mechanism": None, "sasl_username": None, "allow_insecure": False,
                               "enable_idempotence": True, "acks": "all", "compression": "none", "linger_ms": 0,
                               "max_request_size": 1_048_576}


def test_servers_are_normalised_as_they_are_connected_to():
    spec = KafkaSpec.model_validate({**SPEC, "bootstrap_servers": ["Kafka.Example.COM:9092", "[2606:4700::1111]:9093"]})
    assert spec.bootstrap_servers == ["kafka.example.com:9092", "[2606:4700::1111]:9093"]
    sasl = KafkaSpec.model_validate({**SPEC, "tls": True, "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "svc"})
    assert sasl.security_protocol == "SASL_SSL"


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"topic": ".."}, "topic", "is not a Kafka topic name"),
    ({"topic": "orders\n"}, "topic", "is not a Kafka topic name"),
    ({"topic": "x" * 250}, "topic", "is not a Kafka topic name"),
    ({"bootstrap_servers": []}, "bootstrap_servers", "at least 1"),
    ({"bootstrap_servers": ["kafka.example.com"]}, "bootstrap_servers", "has no port"),
    ({"bootstrap_servers": ["0x7f000001:9092"]}, "bootstrap_servers", "looks like an IPv4 address"),
    ({"bootstrap_servers": ["127.0.0.1:9092"]}, "", "not a public address"),
    ({"acks": "leader"}, "", "needs acks: all"),
    ({"acks": "none"}, "acks", "'all' or 'leader'"),
    ({"sasl_username": "svc"}, "", "together"),
    ({"sasl_mechanism": "PLAIN", "sasl_username": "svc"}, "", "set tls, or allow_insecure"),
    ({"reconcile": True}, "", "cannot answer the reconcile probe"),
    ({"compression": "lz4"}, "compression", "'none' or 'gzip'"),
    ({"secret": "hunter2"}, "secret", "give the SASL password as sasl_password"),
    ({"secret": "whsec_QQ=="}, "secret", "24 to 64 bytes"),
    ({"sasl_password": "pw"}, "", "sasl_password needs sasl_mechanism"),
    ({"sasl_password": ""}, "sasl_password", "at least 1 character"),
    ({"tls": True, "sasl_mechanism": "PLAIN", "sasl_username": "svc", "sasl_password": SECRET}, "sasl_password",
     "must not start with 'whsec_'"),
    ({"surprise": 1}, "surprise", "Extra inputs are not permitted"),
])
def test_what_cannot_be_produced_is_refused_naming_the_field(change, field, words):
    [(where, message)] = refused({**SPEC, **change})
    assert where.split(".")[0] == field and words in message, (where, message)


@pytest.mark.parametrize("server", ["[::ffff:0:7f00:1]:9092", "192.0.0.9:9092", "198.18.0.1:9092", "[3fff::1]:9092",
                                    "[5f00::1]:9092", "[100:0:0:1::1]:9092"])
def test_a_special_purpose_address_needs_allow_private_network(server):
    """IANA's special-purpose blocks beyond the private ranges, and the SIIT form of 127.0.0.1."""
    [(where, message)] = refused({**SPEC, "bootstrap_servers": [server]})
    assert where == "" and "not a public address" in message, message
    spec = KafkaSpec.model_validate({**SPEC, "bootstrap_servers": [server], "allow_private_network": True})
    assert spec.allow_private_network


def test_the_sasl_password_is_write_only():
    spec = KafkaSpec.model_validate({**SASL, "sasl_password": "hunter2-pw", "secret": SECRET})
    assert "sasl_password" not in spec.settings() and "hunter2" not in repr(spec)


def test_signing_secrets_rotate_as_a_webhooks_and_the_sasl_password_stays_apart():
    def kept(held: tuple[str, ...], **change: object) -> tuple[str, ...]:
        return keep_secrets(held, KafkaSpec.model_validate({**SASL, **change}))

    assert kept((), secret=SECRET, sasl_password="pw") == (SECRET, "pw")
    assert kept((SECRET, "pw"), secret=NEWER) == (NEWER, SECRET, "pw")  # a rotation keeps the password
    assert kept((NEWER, SECRET, "pw"), secret=NEWEST) == (NEWEST, NEWER, SECRET, "pw")
    assert kept((NEWER, SECRET, "pw"), drop_previous_secrets=True) == (NEWER, "pw")
    assert kept((SECRET, "pw"), sasl_password="new-pw") == (SECRET, "new-pw")
    assert kept(("pw",)) == ("pw",)  # stored before records were signed: the password alone
    assert kept(("pw",), secret=SECRET) == (SECRET, "pw")
    assert keep_secrets((SECRET, "pw"), KafkaSpec.model_validate(SPEC)) == (SECRET,)  # no SASL, no password


def test_a_loopback_broker_is_allowed_with_the_private_network():
    spec = KafkaSpec.model_validate({**SPEC, "bootstrap_servers": ["127.0.0.1:9092"], "allow_private_network": True})
    assert spec.bootstrap_servers == ["127.0.0.1:9092"]


@pytest.mark.parametrize(("error", "submission", "outcome"), [
    (errors.NotEnoughReplicasError, Submission.SUBMITTED, Outcome.RETRYABLE),  # not appended: try again
    (errors.NotLeaderForPartitionError, Submission.SUBMITTED, Outcome.RETRYABLE),
    (errors.TopicAuthorizationFailedError, Submission.SUBMITTED, Outcome.RETRYABLE),  # an ACL can be fixed
    (errors.MessageSizeTooLargeError, Submission.SUBMITTED, Outcome.REJECTED),  # never appended
    (errors.InvalidTopicError, Submission.SUBMITTED, Outcome.REJECTED),
    (errors.CorruptRecordException, Submission.SUBMITTED, Outcome.REJECTED),
    (errors.RequestTimedOutError, Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN),  # may be on the leader
    (errors.NotEnoughReplicasAfterAppendError, Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN),  # on the leader
])
def test_a_brokers_error_says_whether_the_record_was_appended(error, submission, outcome):
    result = broker_refused(error())
    assert (result.submission, result.outcome, result.answered, result.stage) == (submission, outcome, True, "produce")


def test_a_producers_repr_holds_neither_the_sasl_password_nor_the_signing_secrets():
    """A producer entry keeps the destination's secrets (the SASL password among them) to split them once."""
    secrets = (SECRET, "hunter2-pw")
    entry = Producer(KafkaSpec.model_validate({**SASL, "sasl_password": "hunter2-pw"}),
                     datetime(2030, 1, 1, tzinfo=UTC), guard=Guard(5.0))
    entry.signing = (secrets, credentials.split(secrets)[0])  # (as the channel does on a send)
    shown = repr(entry)
    assert "hunter2" not in shown and SECRET.removeprefix("whsec_") not in shown
