import pytest
from pydantic import ValidationError

from outbox import Role, Settings
from outbox.tokens import TokenInfo, hash_token, new_token


def test_defaults_need_no_configuration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = Settings()
    assert settings.database_url == "sqlite:///./outbox.db"
    assert settings.max_payload_bytes == 1024 * 1024


def test_environment_beats_toml_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outbox.toml").write_text('port = 9001\nmax_payload_bytes = 2048\n')
    monkeypatch.setenv("OUTBOX_PORT", "9002")
    settings = Settings()
    assert (settings.port, settings.max_payload_bytes) == (9002, 2048)


def test_the_fanout_limit_has_a_safe_default_and_bounds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Settings().max_fanout == 100
    monkeypatch.setenv("OUTBOX_MAX_FANOUT", "21")
    assert Settings().max_fanout == 21
    for bad in ("0", "10001", "-1"):
        monkeypatch.setenv("OUTBOX_MAX_FANOUT", bad)
        with pytest.raises(ValidationError, match="max_fanout"):
            Settings()


def test_unknown_toml_keys_are_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outbox.toml").write_text('prot = 9001\n')
    with pytest.raises(ValidationError, match="prot"):
        Settings()


@pytest.mark.parametrize(("variable", "value", "bound"), [
    ("OUTBOX_RETENTION_MARGIN_SECONDS", "1e300", "less than or equal to 7776000"),  # (it is subtracted from a time)
    ("OUTBOX_DELIVERED_RETENTION_SECONDS", "1e300", "less than or equal to 3153600000"),
    ("OUTBOX_BACKOFF_INITIAL_SECONDS", "1e300", "less than or equal to 2592000"),
    ("OUTBOX_BACKOFF_INITIAL_SECONDS", "1e-9", "greater than or equal to 0.001"),
    ("OUTBOX_CIRCUIT_PAUSE_SECONDS", "1e300", "less than or equal to 300"),
    ("OUTBOX_POLL_SECONDS", "inf", "less than or equal to 3600"),
    ("OUTBOX_DRAIN_SECONDS", "inf", "less than or equal to 3600"),
    ("OUTBOX_LEASE_SECONDS", "1e300", "less than or equal to 86400"),
    ("OUTBOX_BACKOFF_CAP_SECONDS", "nan", "less than or equal to 2592000"),
])
def test_a_duration_setting_past_its_bound_is_refused_naming_the_bound(tmp_path, monkeypatch, variable, value, bound):
    """Every duration the sender adds to a time is bounded, so none it computes is past what a
    time can hold (a retention margin of 1e300 failed every decision on an unknown outcome)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=bound):
        Settings()


def test_tokens_are_random_and_only_their_hash_is_kept():
    token_id, token = new_token()
    assert token.startswith(f"obx_{token_id}_")
    assert new_token()[1] != token
    assert hash_token(token) == hash_token(token) != token


def test_producers_act_only_in_their_scopes():
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    producer = TokenInfo("a", Role.PRODUCER, ("acme",), None, now, None)
    everywhere = TokenInfo("b", Role.PRODUCER, ("*",), None, now, None)
    operator = TokenInfo("c", Role.OPERATOR, (), None, now, None)
    assert producer.may_act_in("acme") and not producer.may_act_in("globex")
    assert everywhere.may_act_in("globex") and operator.may_act_in("globex")
