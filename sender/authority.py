"""Authority, re-checked right before each send: the outbox row grants nothing by existing.

Providers answer one question — may ``scope`` have this effect at this destination, now? —
and a decision is cached at most ``authority_seconds``. A provider that cannot answer (a policy
endpoint down) says so: the send waits and retries; it is neither allowed nor revoked.
"""

from __future__ import annotations

import asyncio
import enum
import importlib
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

import httpx

from outbox import Intent, Outbox
from outbox.clock import SystemClock
from outbox.ttlcache import TtlCache


@dataclass(frozen=True, slots=True)
class AuthorityRequest:
    """The effect about to be made."""

    scope: str
    channel: str
    destination: str
    action_id: str
    #: The scope that owns the destination (a tenant's own endpoint), None for a shared one: only
    #: the owner's effects may be made there, whatever a provider says.
    owner: str | None = None


class Verdict(str, enum.Enum):
    """A provider's answer."""

    ALLOW = "allow"
    DENY = "deny"
    UNAVAILABLE = "unavailable"  # the provider could not decide; try again later


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict with why, and what it was based on (recorded in the intent's events)."""

    verdict: Verdict
    reason: str
    provider: str
    revision: str | None = None
    #: When the provider was asked (a cached decision keeps the time of the ask it came from), so
    #: an attempt's record shows which revocations its send could have seen.
    checked_at: datetime | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOW


class Authority(Protocol):
    """Something that decides whether an effect may be made now."""

    name: str

    async def check(self, request: AuthorityRequest) -> Decision:
        """Decide; never raises for a provider failure (answer UNAVAILABLE instead)."""
        ...

    async def aclose(self) -> None:
        """Release what the provider holds (connections)."""
        ...


class GrantsAuthority:
    """The built-in grants table (``outbox grants …`` and ``/v1/grants``)."""

    name = "grants"

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    async def check(self, request: AuthorityRequest) -> Decision:
        if request.owner is not None:  # an owned destination's grant is implied for its owner, and only for it
            return owned(request) or Decision(Verdict.ALLOW, f"scope {request.scope!r} owns destination "
                                              f"{request.destination!r}", self.name)
        grant = await self._outbox.store.find_grant(
            request.scope, request.destination, self._outbox.clock.now()
        )
        if grant is None:
            return Decision(
                Verdict.DENY,
                f"no live grant lets scope {request.scope!r} reach destination {request.destination!r}",
                self.name,
            )
        return Decision(Verdict.ALLOW, f"grant {grant.id!r}", self.name, f"{grant.id}@{grant.revision}")

    async def aclose(self) -> None:
        return None


def owned(request: AuthorityRequest) -> Decision | None:
    """The denial of an effect at a destination another scope owns, or None: no provider is asked."""
    if request.owner is None or request.owner == request.scope:
        return None
    return Decision(Verdict.DENY, f"destination {request.destination!r} is owned by another scope", "ownership")


class OwnersOnly:
    """A provider that is asked only about effects the destination's owner allows (every effect
    at a shared destination, and the owner's own at an owned one)."""

    def __init__(self, inner: Authority) -> None:
        self.inner = inner
        self.name = inner.name

    async def check(self, request: AuthorityRequest) -> Decision:
        return owned(request) or await self.inner.check(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class AllowAllAuthority:
    """Allows everything. For local experiments only; says so in every decision."""

    name = "allow-all"

    async def check(self, request: AuthorityRequest) -> Decision:
        return Decision(Verdict.ALLOW, "authority checks are turned off (allow-all)", self.name)

    async def aclose(self) -> None:
        return None


class HttpPolicyAuthority:
    """Asks a policy endpoint: POST the request as JSON, expect ``{"allow": bool, "reason": str}``."""

    name = "http"

    def __init__(self, url: str, *, timeout: float = 2.0, client: httpx.AsyncClient | None = None):
        self.url = url
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def check(self, request: AuthorityRequest) -> Decision:
        body = {"scope": request.scope, "channel": request.channel,
                "destination": request.destination, "action_id": request.action_id}
        try:
            response = await self._client.post(self.url, json=body)
        except httpx.HTTPError as exc:
            return Decision(Verdict.UNAVAILABLE, f"policy endpoint unreachable: {exc!r}", self.name)
        if response.status_code >= 500 or response.status_code in (408, 429):
            return Decision(Verdict.UNAVAILABLE, f"policy endpoint answered {response.status_code}", self.name)
        try:
            answer = response.json()
            allow = answer["allow"]
        except (ValueError, KeyError, TypeError):
            return Decision(Verdict.UNAVAILABLE,
                            f"policy endpoint answered {response.status_code} without an 'allow' field",
                            self.name)
        if response.status_code >= 400 or not isinstance(allow, bool):
            return Decision(Verdict.UNAVAILABLE, f"policy endpoint answered {response.status_code}", self.name)
        reason = str(answer.get("reason") or ("allowed" if allow else "denied by policy"))
        revision = answer.get("revision")
        return Decision(Verdict.ALLOW if allow else Verdict.DENY, reason, self.name,
                        None if revision is None else str(revision))

    async def aclose(self) -> None:
        await self._client.aclose()


PolicyFunction = Callable[[AuthorityRequest], "bool | Decision | Awaitable[bool | Decision]"]


class CallableAuthority:
    """A Python function (sync or async) returning a bool or a Decision."""

    name = "python"

    def __init__(self, function: PolicyFunction) -> None:
        self._function = function

    async def check(self, request: AuthorityRequest) -> Decision:
        try:
            answer: Any = self._function(request)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:  # a broken policy must not revoke: it could not decide
            return Decision(Verdict.UNAVAILABLE, f"policy function raised {exc!r}", self.name)
        if isinstance(answer, Decision):
            return answer
        return Decision(Verdict.ALLOW if answer else Verdict.DENY,
                        "allowed by policy function" if answer else "denied by policy function", self.name)

    async def aclose(self) -> None:
        return None


#: Decisions a CachedAuthority keeps at most: one per (scope, channel, destination) seen lately,
#: so a harness with a scope per user does not grow it without end.
MAX_CACHED = 4096


WALL = SystemClock()


class CachedAuthority:
    """Remembers ALLOW and DENY decisions for at most ``seconds`` per (scope, channel, destination)."""

    def __init__(self, inner: Authority, seconds: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = WALL.now):
        self.inner = inner
        self.name = inner.name
        self.seconds = seconds
        self._wall = wall
        self._cache: TtlCache[tuple[str, str, str], Decision] = TtlCache(seconds, MAX_CACHED, clock)
        self._pending: dict[tuple[str, str, str], asyncio.Future[Decision]] = {}

    def cached(self, scope: str, channel: str, destination: str) -> Decision | None:
        """The decision still remembered for an effect of ``scope`` on ``channel`` at
        ``destination``, or None: a worker checks a batch without awaiting the ones the cache
        answers (and without making a request for each)."""
        return self._cache.get((scope, channel, destination), None)

    async def check(self, request: AuthorityRequest) -> Decision:
        if self.seconds <= 0:
            return await self._ask(request)
        key = (request.scope, request.channel, request.destination)
        cached = self._cache.get(key, None)
        if cached is not None:
            return cached
        asked = self._cache.clock()
        if key in self._pending:  # one question in flight per key, however many sends wait
            return await asyncio.shield(self._pending[key])
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            decision = await self._ask(request)
            if decision.verdict is not Verdict.UNAVAILABLE:
                self._cache.put(key, decision, at=asked)
            future.set_result(decision)
            return decision
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._pending[key]

    async def _ask(self, request: AuthorityRequest) -> Decision:
        """The provider's decision, stamped with when it was asked (before its answer, so a
        revocation committed before that time is one the answer saw)."""
        asked = self._wall()
        return replace(await self.inner.check(request), checked_at=asked)

    async def aclose(self) -> None:
        await self.inner.aclose()


def authorizer(outbox: Outbox) -> Callable[[Intent], Awaitable[str | None]]:
    """A fresh (uncached) check of the configured provider, for operators' replays: returns why
    an intent is denied, or None when it may be sent."""
    provider = authority_from_setting(outbox.settings.authority, outbox)

    async def authorize(intent: Intent) -> str | None:
        destination = await outbox.store.get_destination(intent.destination)
        decision = await provider.check(AuthorityRequest(intent.scope, intent.channel, intent.destination,
                                                         intent.action_id, destination.owner if destination else None))
        return None if decision.allowed else decision.reason

    return authorize


def authority_from_setting(spec: str, outbox: Outbox) -> Authority:
    """The provider a setting names: ``grants``, ``allow-all``, ``http(s)://…`` or
    ``python:module:function``, asked only what an owned destination's owner allows
    (``OwnersOnly``; the grants imply the owner's grant themselves)."""
    if spec == "grants":
        return OwnersOnly(GrantsAuthority(outbox))
    if spec == "allow-all":
        return OwnersOnly(AllowAllAuthority())
    if spec.startswith(("http://", "https://")):
        return OwnersOnly(HttpPolicyAuthority(spec))
    if spec.startswith("python:"):
        module, _, attribute = spec.removeprefix("python:").partition(":")
        if not module or not attribute:
            raise ValueError(f"authority {spec!r}: use python:package.module:function")
        return OwnersOnly(CallableAuthority(getattr(importlib.import_module(module), attribute)))
    raise ValueError(
        f"authority {spec!r} is not one of grants, allow-all, an http(s) URL, python:module:function"
    )
