"""What a RabbitMQ destination must be, and the URL its connection is opened with."""

from __future__ import annotations

from datetime import UTC, datetime

import aiormq
import pytest
from pydantic import ValidationError

from outbox import Destination, OnUnknown
from sender.rabbitmq import CHANNEL, RabbitSpec, keep_secrets
from sender.rabbitmq.channel import RabbitChannel
from sender.rabbitmq.links import Link, connection_url
from tests.conftest import SECRET

SPEC = {"channel": "rabbitmq", "url": "amqps://svc@rabbit.example.com/", "exchange": "events", "routing_key": "orders"}
NEWER = "whsec_" + "Tk" * 20


def refused(spec: dict) -> list[str]:
    with pytest.raises(ValidationError) as error:
        RabbitSpec.model_validate(spec)
    return [e["msg"] for e in error.value.errors()]


def test_the_url_says_tls_host_port_user_and_vhost():
    spec = RabbitSpec.model_validate({**SPEC, "url": "amqps://svc%40corp@Rabbit.Example.COM/prod%2Feu"})
    assert (spec.tls, spec.host, spec.port, spec.username, spec.vhost) == (
        True, "rabbit.example.com", 5671, "svc@corp", "prod/eu")
    plain = RabbitSpec.model_validate({**SPEC, "url": "amqp://[2606:4700::1111]:5673"})
    assert (plain.tls, plain.host, plain.port, plain.username, plain.vhost) == (
        False, "2606:4700::1111", 5673, "guest", "/")


@pytest.mark.parametrize(("url", "vhost"), [("amqps://svc@rabbit.example.com/", "/"),
                                            ("amqps://svc@rabbit.example.com/%2F", "/"),
                                            ("amqps://svc@rabbit.example.com/prod%2Feu", "prod/eu"),
                                            ("amqps://svc@rabbit.example.com", "/")])
async def test_the_connection_is_opened_on_the_vhost_the_url_names(url: str, vhost: str):
    opened = aiormq.Connection(connection_url(RabbitSpec.model_validate({**SPEC, "url": url}), "p w/@:x"))
    assert opened.vhost == vhost
    assert (opened.url.user, opened.url.password) == ("svc", "p w/@:x")  # any password, as given
    assert "x" not in str(opened).partition("@")[0]  # (aiormq censors the password when it shows the URL)


def test_defaults_publish_persistently_and_retry_an_unknown():
    spec = RabbitSpec.model_validate({**SPEC, "password": "hunter2-pw"})
    assert spec.on_unknown is OnUnknown.ALWAYS
    assert spec.settings() == {"url": "amqps://svc@rabbit.example.com/", "exchange": "events", "routing_key": "orders",
                               "routing_key_from": None, "allow_insecure": False}
    assert "hunter2" not in repr(spec) and "hunter2" not in spec.model_dump_json()
    assert RabbitSpec.model_json_schema()["properties"]["password"]["writeOnly"] is True


@pytest.mark.parametrize(("change", "words"), [
    ({"url": "amqp://rabbit.example.com/a/b"}, "is not amqp://"),
    ({"url": "amqp://rabbit.example.com:99999/"}, "outside 1-65535"),
    ({"url": "amqp://rabbit.example.com:0/"}, "outside 1-65535"),
    ({"url": "amqp://rabbit example.com/"}, "rabbit example.com"),
    ({"url": "amqp://svc:pw@rabbit.example.com/"}, "must not hold the password"),
    ({"url": "amqp://127.0.0.1/"}, "is not a public address"),
    ({"url": "amqp://[::1]/"}, "is not a public address"),
    ({"exchange": "a/b"}, "is not an exchange name"),
    ({"routing_key": "é" * 128}, "at most 255 bytes"),
    ({"password": "whsec_" + "A" * 40}, "must not start with 'whsec_'"),
])
def test_what_cannot_be_published_is_refused_naming_why(change: dict, words: str):
    assert any(words in message for message in refused({**SPEC, **change})), refused({**SPEC, **change})


def test_an_update_keeps_the_password_and_rotates_the_signing_secrets():
    held = keep_secrets((), RabbitSpec.model_validate({**SPEC, "secret": SECRET, "password": "pw-1"}))
    assert held == (SECRET, "pw-1")
    assert keep_secrets(held, RabbitSpec.model_validate({**SPEC, "secret": NEWER})) == (NEWER, SECRET, "pw-1")
    assert keep_secrets(held, RabbitSpec.model_validate({**SPEC, "password": "pw-2"})) == (SECRET, "pw-2")


def test_the_console_says_where_a_destination_publishes():
    settings = RabbitSpec.model_validate({**SPEC, "url": "amqps://svc@rabbit.example.com/prod"}).settings()
    assert CHANNEL.target is not None
    assert CHANNEL.target(settings) == "exchange events, routing key 'orders' at rabbit.example.com:5671, vhost prod"
    default = RabbitSpec.model_validate({**SPEC, "exchange": "", "routing_key": "billing"}).settings()
    assert CHANNEL.target(default) == "exchange amq.default, routing key 'billing' at rabbit.example.com:5671, vhost /"


async def test_a_links_repr_holds_neither_the_password_nor_the_signing_secrets():
    """A link keeps the destination's secrets (the password among them) to split them once."""
    spec = RabbitSpec.model_validate({**SPEC, "password": "hunter2-pw"})
    now = datetime(2030, 1, 1, tzinfo=UTC)
    destination = Destination("bus", "rabbitmq", {}, (SECRET, "hunter2-pw"), True, 3600, OnUnknown.ALWAYS, 5.0,
                              False, False, False, now, now)
    link = Link(spec, now, connection=aiormq.Connection(connection_url(spec, "hunter2-pw")))
    assert RabbitChannel._signing(link, destination) == (SECRET,)
    shown = repr(link)
    assert "hunter2" not in shown and SECRET.removeprefix("whsec_") not in shown
