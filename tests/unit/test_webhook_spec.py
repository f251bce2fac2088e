import pytest
from pydantic import ValidationError

from outbox.shapes import destination_json
from sender.webhook import WebhookSpec, new_secret

SECRET = new_secret()


def test_new_secret_is_a_valid_standard_webhooks_secret():
    assert WebhookSpec(url="https://x.example/h", secret=SECRET).secret == SECRET


@pytest.mark.parametrize(
    "url", ["ftp://x.example/", "/relative", "https://user:pw@x.example/", "not a url"]
)
def test_urls_must_be_absolute_http_without_credentials(url):
    with pytest.raises(ValidationError):
        WebhookSpec(url=url, secret=SECRET)


@pytest.mark.parametrize(("url", "words"), [
    ("http://１２７.０.０.１:8080/hook", "read as the address '127.0.0.1'"),
    ("http://127。0。0。1:8080/hook", "read as the address '127.0.0.1'"),
    ("http://１６９.２５４.１６９.２５４/latest/meta-data/", "read as the address '169.254.169.254'"),
    ("http://10。0。0。1/", "read as the address '10.0.0.1'"),
    ("http://2130706433/", "looks like an IPv4 address"),
    ("http://127.1/", "looks like an IPv4 address"),
    ("http://0177.0.0.1/", "looks like an IPv4 address"),
    ("http://0x7f000001/", "looks like an IPv4 address"),
    ("http://0/", "looks like an IPv4 address"),
    ("http://billing..example/", "empty label"),
    ("http://ｂｉｌｌｉｎｇ.example/", "read as 'billing'"),
    ("http://billing.example:99999/", "port '99999'"),
])
@pytest.mark.parametrize("allow_private_network", [False, True])
def test_a_host_that_is_no_ordinary_hostname_or_canonical_address_is_refused(url, words, allow_private_network):
    """Whether or not the private network is allowed: the client would connect to another host
    than the one written."""
    with pytest.raises(ValidationError) as refused:
        WebhookSpec(url=url, secret=SECRET, allow_private_network=allow_private_network)
    [error] = refused.value.errors()
    assert error["loc"] == ("url",) and words in error["msg"], error


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/hook", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:8080/", "http://[::ffff:10.0.0.1]/", "http://0.0.0.0:8080/",
    # IANA's special-purpose blocks beyond the private ranges, and the SIIT form of 127.0.0.1
    "http://[::ffff:0:7f00:1]:8080/", "http://192.0.0.9/", "http://198.18.0.1/", "http://[3fff::1]/",
    "http://[5f00::1]/", "http://[100:0:0:1::1]/",
])
def test_a_literal_non_public_address_needs_allow_private_network(url):
    with pytest.raises(ValidationError) as refused:
        WebhookSpec(url=url, secret=SECRET)
    [error] = refused.value.errors()
    assert error["loc"] == ("url",), error
    assert "is not a public address" in error["msg"] and "set allow_private_network" in error["msg"]
    assert WebhookSpec(url=url, secret=SECRET, allow_private_network=True).allow_private_network


def test_ordinary_hosts_register_without_the_private_network_and_look_alikes_do_not():
    for url in ("https://billing.example.com/webhooks", "https://bücher.example/h", "http://8.8.8.8:8080/",
                "http://[2606:4700::1111]/", "http://localhost:8080/"):  # a name is judged when it is resolved
        assert WebhookSpec(url=url, secret=SECRET).url == url
    with pytest.raises(ValidationError, match="read as 'localhost'"):
        WebhookSpec(url="http://ｌｏｃａｌｈｏｓｔ:8080/", secret=SECRET)


@pytest.mark.parametrize("secret", ["plain", "whsec_!!!", "whsec_" + "QQ=="])
def test_secrets_must_be_whsec_base64_of_sensible_length(secret):
    with pytest.raises(ValidationError):
        WebhookSpec(url="https://x.example/", secret=secret)


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError, match="extra"):
        WebhookSpec(url="https://x.example/", secret=SECRET, colour="red")


def test_repr_and_public_view_never_show_secrets():
    from datetime import UTC, datetime

    from outbox import Destination, OnUnknown

    now = datetime.now(UTC)
    d = Destination("b", "webhook", {"url": "https://x.example/"}, (SECRET,), False, 60,
                    OnUnknown.DECLARED, 5.0, False, False, False, now, now)
    assert SECRET not in repr(d)
    assert SECRET not in str(destination_json(d))
    assert destination_json(d)["signing_secrets"] == 1
