import pytest
from pydantic import ValidationError

from outbox import DestinationSpec
from outbox.destinations import new_secret

SECRET = new_secret()


def test_new_secret_is_a_valid_standard_webhooks_secret():
    assert DestinationSpec(url="https://x.example/h", secret=SECRET).secret == SECRET


@pytest.mark.parametrize(
    "url", ["ftp://x.example/", "/relative", "https://user:pw@x.example/", "not a url"]
)
def test_urls_must_be_absolute_http_without_credentials(url):
    with pytest.raises(ValidationError):
        DestinationSpec(url=url, secret=SECRET)


@pytest.mark.parametrize("secret", ["plain", "whsec_!!!", "whsec_" + "QQ=="])
def test_secrets_must_be_whsec_base64_of_sensible_length(secret):
    with pytest.raises(ValidationError):
        DestinationSpec(url="https://x.example/", secret=secret)


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError, match="extra"):
        DestinationSpec(url="https://x.example/", secret=SECRET, colour="red")


def test_repr_and_public_view_never_show_secrets():
    from datetime import UTC, datetime

    from outbox import Channel, Destination, OnUnknown

    now = datetime.now(UTC)
    d = Destination("b", Channel.WEBHOOK, "https://x.example/", (SECRET,), False, 60,
                    OnUnknown.DECLARED, 5.0, False, False, False, now, now)
    assert SECRET not in repr(d)
    assert SECRET not in str(d.public())
    assert d.public()["signing_secrets"] == 1
