"""Settings: one typed object, from ``OUTBOX_*`` variables, then ``outbox.toml``, then defaults."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .crash import CrashPoint
from .fields import MAX_ROTATION_SECONDS


class Settings(BaseSettings):
    """Everything the service can be told. Each field is also ``OUTBOX_<NAME>``."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_", toml_file="outbox.toml", extra="forbid", frozen=True
    )

    database_url: str = Field(
        default="sqlite:///./outbox.db", description="sqlite:///path.db (embedded default) or postgresql://user@host/db"
    )
    secrets_key_file: Path | None = Field(
        default=None,
        description="file with the key that seals destination secrets in the database, one key a line "
                    "(default on SQLite: beside the database, outbox.db -> outbox.key, made on first start; "
                    "required on PostgreSQL)",
    )
    host: str = Field(default="127.0.0.1", description="address `outbox serve` listens on")
    port: int = Field(default=8080, ge=0, le=65535, description="port `outbox serve` listens on")
    tls_certfile: Path | None = Field(
        default=None,
        description="`outbox serve` speaks HTTPS itself with this PEM certificate chain (and the key, unless "
                    "tls_keyfile names it); unset: plain HTTP, for a TLS proxy in front",
    )
    tls_keyfile: Path | None = Field(
        default=None, description="the PEM private key (unencrypted) of tls_certfile, when that file does not hold it",
    )
    proxy_headers: bool = Field(
        default=False,
        description="`outbox serve` takes X-Forwarded-Proto and X-Forwarded-For from the peers forwarded_allow_ips "
                    "names (a TLS proxy in front); off: from nobody",
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1,::1",
        description="with proxy_headers, the proxies trusted: addresses and networks, comma-separated "
                    "(10.0.0.0/8), or * for any peer",
    )
    console_session_seconds: float = Field(
        default=8 * 3600, ge=60, le=7 * 86_400,
        description="how long a console sign-in lasts (at most 7 days); signing out, or revoking its token, "
                    "ends it sooner",
    )
    max_payload_bytes: int = Field(
        default=1024 * 1024, ge=1, description="largest accepted payload (canonical JSON bytes)"
    )
    max_batch_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1,
        description="largest accepted body of a batch, POST /v1/intents:batch or /v1/events:batch (each payload "
                    "is held to max_payload_bytes too, in its item's place)",
    )
    max_fanout: int = Field(
        default=100, ge=1, le=10_000,
        description="most intents one event may make: the destinations subscribed to its topic that its scope may "
                    "reach (one a channel would skip counts); an event past it is refused (422 fanout-too-large), "
                    "nothing recorded",
    )
    max_batch_fanout: int = Field(
        default=10_000, ge=1, le=1_000_000,
        description="most intents the events of one batch (POST /v1/events:batch, publish_each) may make together: "
                    "an event that would take the batch past it is refused in its place (422 fanout-too-large), "
                    "so one request holds the database for a bounded time",
    )
    default_max_attempts: int = Field(
        default=24, ge=1, le=1000, description="attempts before a dead letter, unless the intent says"
    )
    sqlite_busy_timeout_ms: int = Field(
        default=5000, ge=0, description="how long a write waits for another process's lock"
    )
    token_cache_seconds: float = Field(
        default=1.0, ge=0, description="how long a valid API token is trusted without a lookup"
    )
    worker: bool = Field(default=True, description="`outbox serve` runs an embedded sender")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="`outbox worker` serves /metrics, /healthz and /readyz on this port (on `host`)",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="the bearer token /metrics asks for (Prometheus' authorization setting; operator and admin "
                    "tokens work too); unset, /metrics is open",
    )
    worker_concurrency: int = Field(default=64, ge=1, le=4096, description="sends in flight per worker")
    circuit_failures: int = Field(
        default=5, ge=0, description="sends in a row without an answer that pause a destination (0: never)"
    )
    circuit_pause_seconds: float = Field(
        default=5.0, gt=0, le=300,
        description="a paused destination's first pause (at most 300 s); each next one twice as long, up to 300 s"
    )
    lease_seconds: float = Field(default=30.0, gt=0, le=86_400, description="how long a claim lasts unless renewed")
    poll_seconds: float = Field(
        default=1.0, gt=0, le=3600, description="longest a worker waits before looking for work again (at most an hour)"
    )
    drain_seconds: float = Field(
        default=10.0, ge=0, le=3600, description="on SIGTERM, how long in-flight sends may finish (at most an hour)"
    )
    authority: str = Field(
        default="grants",
        description="grants, allow-all, an http(s) policy URL, or python:module:function",
    )
    authority_seconds: float = Field(default=2.0, ge=0, description="longest a decision is cached")
    backoff_initial_seconds: float = Field(
        default=1.0, ge=0.001, le=30 * 86_400, description="first retry delay (1 ms to 30 days)")
    backoff_cap_seconds: float = Field(default=3600.0, gt=0, le=30 * 86_400, description="longest retry delay")
    retention_margin_seconds: float = Field(
        default=300.0, ge=0, le=90 * 86_400,
        description="stop blind retries this long before a receiver forgets (at most 90 days, the longest retention)"
    )
    delivered_retention_seconds: float = Field(
        default=7 * 86_400, gt=0, le=100 * 365 * 86_400,
        description="delivered and cancelled intents are pruned after this (at most 100 years)"
    )
    tenant_channels: list[str] = Field(
        default=["webhook"],
        description="the channels a tenant's own destinations may use (email and kafka reach your own servers)",
    )
    tenant_max_destinations: int = Field(
        default=20, ge=0, le=10_000, description="the most destinations one tenant (scope) may own")
    tenant_max_subscriptions: int = Field(
        default=100, ge=0, le=100_000, description="the most topic subscriptions a tenant's destinations hold in all")
    tenant_private_networks: list[str] = Field(
        default_factory=list,
        description="the scopes whose own destinations may reach loopback and private addresses "
                    "(allow_private_network); every other tenant's are held to the SSRF guard",
    )
    secret_rotation_seconds: float = Field(
        default=86_400, ge=0, le=MAX_ROTATION_SECONDS,
        description="after a destination's secret is rotated, how long the previous one still signs beside it "
                    "(at most 30 days; 0: not at all)",
    )
    portal_link_seconds: float = Field(
        default=600, ge=10, le=3600,
        description="how long a tenant portal link stays openable once minted (at most an hour); it opens once",
    )
    portal_session_seconds: float = Field(
        default=3600, ge=60, le=7 * 86_400,
        description="how long a portal session lasts when its link asks for no length, and the most a link may ask "
                    "(at most 7 days); revoking the token that minted the link ends it sooner",
    )
    portal_name: str = Field(
        default="Webhooks", min_length=1, max_length=80, description="the tenant portal's title, as your users know it")
    portal_colour: str = Field(
        default="#24292f", description="the tenant portal's header colour: #rgb or #rrggbb")
    portal_logo_url: str | None = Field(
        default=None, description="an https:// image shown in the tenant portal's header (the page allows images "
                                  "from its origin only)")
    portal_frame_ancestors: list[str] = Field(
        default_factory=list,
        description="the origins whose pages may show the tenant portal in a frame (https://app.example.com); "
                    "none: it is never framed",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="debug, info, warning or error"
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="text lines, or one JSON object per line for log pipelines"
    )

    crash_at: CrashPoint | None = Field(
        default=None,
        description="tests only: a worker SIGKILLs itself at this step (see outbox.crash); never set in production",
    )

    @field_validator("metrics_token")
    @classmethod
    def _token_text(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.fullmatch(r"[\x21-\x7e]{16,256}", value.get_secret_value()):
            raise ValueError("the metrics token must be 16 to 256 visible ASCII characters, such as the output "
                             "of `openssl rand -hex 32`")
        return value

    @field_validator("portal_colour")
    @classmethod
    def _colour(cls, value: str) -> str:
        if not re.fullmatch(r"#(?:[0-9a-fA-F]{3}){1,2}", value):
            raise ValueError(f"{value!r} is not a colour as #rgb or #rrggbb")
        return value

    @field_validator("portal_logo_url")
    @classmethod
    def _logo(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/-]*)?",
                                                  value):
            raise ValueError(f"{value!r} is not an https:// URL of letters, digits, '.', '_', '~', '%', '-' and '/' "
                             "(no query, no quotes)")
        return value

    @field_validator("portal_frame_ancestors")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if not re.fullmatch(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?", origin):
                raise ValueError(f"{origin!r} is not an origin as https://host[:port] (no path)")
        return value

    @field_validator("tls_keyfile")
    @classmethod
    def _key_of_a_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("tls_certfile") is None:
            raise ValueError("a TLS key needs its certificate: set tls_certfile too")
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _addresses(cls, value: str) -> str:
        """Each entry an address or a network, as uvicorn reads them; uvicorn would take a typo
        for a name no peer has, silently trusting nobody."""
        entries = [entry.strip() for entry in value.split(",")]
        if entries == ["*"]:
            return "*"
        for entry in entries:
            try:
                ipaddress.ip_network(entry) if "/" in entry else ipaddress.ip_address(entry)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network (name each proxy by its address, "
                                 "a network as 10.0.0.0/8, comma-separated; or * for any peer)") from None
        return ",".join(entries)

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))
