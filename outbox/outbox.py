"""The library entry point: an ``Outbox`` opened from a database URL.

    async with await Outbox.open("sqlite:///./outbox.db") as box:
        await box.enqueue(destination="billing", scope="acme", payload={"invoice": 42})

        async with box.transaction() as tx:      # the caller's row and its intent, together
            await tx.execute("INSERT INTO orders (id) VALUES (?)", (7,))
            await tx.enqueue(destination="billing", scope="acme", payload={"order": 7})

The facade is longer than most modules (about 600 lines): it is the library's one front door,
each method a short check in front of the store (the API's presenters are ``outbox.shapes``').
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Unpack

from . import channels, secrets_key, tenants, timestamps
from .clock import Clock, OffsetClock, SystemClock
from .connections import CallerTransaction, bind_async
from .cursor import MAX_PAGE
from .destinations import KEPT_SECRETS, Destination, DestinationSpec
from .errors import (
    AmbiguousActionId,
    InvalidInput,
    NoDatabase,
    NotFound,
    OutboxError,
    OwnedDestination,
    UnknownDestination,
)
from .fields import MAX_ROTATION_SECONDS
from .grants import Grant, GrantSpec
from .ids import (
    ACTION_ID,
    DESTINATION_ID,
    SCOPE,
    TOKEN_ID,
    TOKEN_LABEL,
    check,
    intent_key,
)
from .intake import Intake, IntentFields
from .metrics import Metrics
from .model import SETTLED, Enqueued, Event, Intent, NewIntent, Role, Status
from .portal import PortalLink, PortalSession, new_link_token
from .publishing import Publishing, PublishingTransaction
from .settings import Settings
from .signals import Signal
from .store import History, IntentQuery, Page, SharesClock, Store, SupportsListener, Transaction, store_for_url
from .tokens import SESSIONS_PER_TOKEN, ConsoleSession, TokenInfo, hash_token, new_session_id, new_token
from .ttlcache import TtlCache

log = logging.getLogger("outbox")


#: Valid tokens an outbox remembers at most (``authenticate``): a token is cheap to read again.
MAX_TOKENS = 10_000


class Outbox(Publishing):
    """Durable intents: enqueue, inspect, publish events (``outbox.publishing``), and the
    registries they depend on."""

    def __init__(self, store: Store, *, settings: Settings | None = None, clock: Clock | None = None):
        self.store = store
        self.settings = settings or Settings()
        self.clock: Clock = clock or SystemClock()
        #: The producer's checks (``outbox.intake``), with this outbox's settings and clock.
        self.intake = Intake(self.settings, lambda: self.clock.now())
        self._tokens: TtlCache[str, TokenInfo] = TtlCache(self.settings.token_cache_seconds, MAX_TOKENS)
        self.metrics = Metrics()
        #: Wakes an embedded worker when intents are enqueued here.
        self.enqueued = Signal()
        #: Wakes long polls when an intent here reaches a settled status.
        self.settled = Signal()
        #: Set once the serving process starts to shut down: long polls answer at once.
        self.closing = asyncio.Event()
        #: What follows the store while open (its clock, its wake-ups), cancelled by ``close``.
        self._companions: list[asyncio.Task[None]] = []

    @classmethod
    async def open(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        clock: Clock | None = None,
        migrate: bool = True,
        create: bool = True,
    ) -> Outbox:
        """Open (and by default migrate) the store at ``url`` (default: the settings' URL).
        Without ``create``, a SQLite database that does not exist yet raises NoDatabase, naming
        the URL, instead of being made empty (a command run from the wrong directory).

        A store shared by hosts (PostgreSQL) lends its clock when none is given: the outbox reads
        the database's time (an OffsetClock, re-measured every few minutes), so every host writes
        and judges leases on one timeline. A store that tells of intents made pending by other
        processes wakes this outbox's workers (``enqueued``) when they are; polling remains the
        fallback.

        The store gets this process's keyring (``outbox.secrets_key.unlock``: the settings' key file,
        or on SQLite the one beside the database, made on first start); a key file that is
        missing, unreadable or does not hold the database's key raises SecretsKeyError."""
        settings = settings or Settings()
        url = url or settings.database_url
        store = store_for_url(url, busy_timeout_ms=settings.sqlite_busy_timeout_ms, create=create)
        measure = store.clock_offset if clock is None and isinstance(store, SharesClock) else None
        try:
            await store.open()
        except NoDatabase as exc:
            raise NoDatabase(f"there is no outbox database at {url} ({exc.message})") from None
        try:
            if migrate:  # (a caller that migrates itself unlocks after it: ``secrets_key.unlock``)
                await store.migrate()
                await secrets_key.unlock(store, settings)
            if measure is not None:
                clock = OffsetClock(await measure())
        except BaseException:
            await store.close()
            raise
        box = cls(store, settings=settings, clock=clock)
        if measure is not None and isinstance(box.clock, OffsetClock):
            box._companions.append(asyncio.create_task(box.clock.follow(measure)))
        if isinstance(store, SupportsListener):
            box._companions.append(asyncio.create_task(store.listen(box.enqueued.notify)))
        return box

    async def close(self) -> None:
        """Stop following the store, finish pending writes and close the store."""
        for task in self._companions:
            task.cancel()
        await asyncio.gather(*self._companions, return_exceptions=True)
        self._companions.clear()
        await self.store.close()

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- producing -----------------------------------------------------------------------

    def prepare(self, **intent: Any) -> tuple[NewIntent, Event]:
        """Validate and digest an intent without writing it (``Intake.intent``). Raises InvalidInput."""
        return self.intake.intent(**intent)

    async def enqueue(self, **intent: Unpack[IntentFields]) -> Enqueued:
        """Record an intent durably (its fields: ``IntentFields``); returns once it survives
        power loss.

        Same scope, action_id, destination, payload and ordering_key again returns the existing intent
        (``created=False``); anything else under that scope and action_id raises IntentConflict.
        Another scope's action ids never meet this one's.
        """
        new, event = self.prepare(**intent)
        result = await self.store.insert_intent(new, event)
        self.enqueued.notify()
        return result

    async def enqueue_many(self, intents: Iterable[Mapping[str, Any]]) -> list[Enqueued]:
        """Enqueue several intents in one transaction (one fsync): all are recorded, or none."""
        prepared = [self.prepare(**intent) for intent in intents]
        results = await self.store.insert_intents(prepared) if prepared else []
        self.enqueued.notify()
        return results

    async def enqueue_each(self, intents: Iterable[Mapping[str, Any]]) -> list[Enqueued | OutboxError]:
        """Enqueue several intents in one transaction (one fsync), each on its own: an intent
        refused (invalid, unknown destination, conflict) stands as its error in its place and
        the others are recorded; if the transaction fails, none is (and that error is raised)."""
        results: list[Enqueued | OutboxError | None] = []
        prepared: list[tuple[NewIntent, Event]] = []
        for intent in intents:
            try:
                prepared.append(self.prepare(**intent))
                results.append(None)
            except InvalidInput as exc:
                results.append(exc)
        stored = iter(await self.store.insert_each(prepared) if prepared else [])
        done = [next(stored) if result is None else result for result in results]
        if any(isinstance(result, Enqueued) and result.created for result in done):
            self.enqueued.notify()
        return done

    @asynccontextmanager
    async def transaction(self, *, connection: Any = None) -> AsyncIterator[OutboxTransaction]:
        """A transaction carrying the caller's own SQL and enqueues: both commit, or neither.

        ``connection``: the caller's own asyncio connection or session, inside the caller's
        transaction (asyncpg, psycopg's AsyncConnection, aiosqlite, SQLAlchemy's AsyncConnection
        or AsyncSession: ``outbox.connections``), to enqueue on instead; they commit or roll back
        with it, and the outbox never commits, rolls back or ends it. Raises NoTransaction for a
        connection with no transaction open."""
        if connection is not None:
            yield OutboxTransaction(self, CallerTransaction(await bind_async(connection)))
            return
        async with self.store.transaction() as tx:
            yield OutboxTransaction(self, tx)
        self.enqueued.notify()

    # -- reading -------------------------------------------------------------------------

    async def get(self, action_id: str, *, scope: str | None = None,
                  scopes: Sequence[str] | None = None) -> Intent:
        """The intent an action id names: in ``scope`` when given, else the one among ``scopes``
        (None: every scope) that uses it. Raises NotFound, or AmbiguousActionId when several of
        those scopes use it."""
        key = self._named_key(action_id, scope, scopes)
        if key is not None:
            found = [i for i in [await self.store.get_intent(key)] if i is not None]
        else:
            found = [i for i in await self.store.intents_named(action_id) if scopes is None or i.scope in scopes]
        if not found:
            raise NotFound(f"intent {action_id!r} does not exist" + (f" in scope {scope!r}" if scope else ""))
        if len(found) > 1:
            raise AmbiguousActionId(
                f"action_id {action_id!r} is used in {len(found)} scopes ({', '.join(i.scope for i in found)}); "
                "name the scope too")
        return found[0]

    async def wait(self, action_id: str, timeout: float, *, scope: str | None = None,
                   poll_seconds: float = 0.5) -> Intent:
        """The intent once it is settled (delivered, dead, revoked, unknown, cancelled) or when
        ``timeout`` seconds have passed, whichever is first. Raises NotFound, AmbiguousActionId.

        An ``unknown`` intent is returned as unknown: its attempts say what may have happened.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        key = (await self.get(action_id, scope=scope)).key
        while True:
            intent = await self.store.get_intent(key)
            if intent is None:
                raise NotFound(f"intent {action_id!r} does not exist")
            remaining = deadline - asyncio.get_running_loop().time()
            if intent.status in SETTLED or remaining <= 0 or self.closing.is_set():
                return intent
            await self.settled.wait(min(remaining, poll_seconds))

    def begin_closing(self) -> None:
        """End every long poll now, with the intent as it stands (the process is shutting down,
        and a poll may otherwise hold it up for a minute)."""
        self.closing.set()
        self.settled.notify()

    async def history(self, action_id: str, *, scope: str | None = None) -> History:
        """An intent's attempts and events. Raises NotFound, AmbiguousActionId (see ``get``)."""
        return (await self.show(action_id, scope=scope))[1]

    async def show(self, action_id: str, *, scope: str | None = None,
                   scopes: Sequence[str] | None = None) -> tuple[Intent, History]:
        """An intent with its attempts and events, from one read, so the status shown is never
        older than the history beside it (with the scope named, that read is all it costs).
        Raises NotFound, AmbiguousActionId (see ``get``)."""
        key = self._named_key(action_id, scope, scopes) or (await self.get(action_id, scopes=scopes)).key
        history = await self.store.history(key)
        if history.intent is None:
            raise NotFound(f"intent {action_id!r} does not exist" + (f" in scope {scope!r}" if scope else ""))
        return history.intent, history

    @staticmethod
    def _named_key(action_id: str, scope: str | None, scopes: Sequence[str] | None) -> str | None:
        """The key of ``action_id`` in ``scope`` when a scope is named (checked, no read needed),
        else None: the scopes using the action id must be looked up. Raises NotFound for a named
        scope outside ``scopes``."""
        check(ACTION_ID, action_id, "action_id")
        if scope is None:
            return None
        check(SCOPE, scope, "scope")
        if scopes is not None and scope not in scopes:
            raise NotFound(f"intent {action_id!r} does not exist in scope {scope!r}")
        return intent_key(scope, action_id)

    async def waiting_behind(self, intent: Intent, *, scopes: Sequence[str] | None = None) -> Behind | None:
        """What keeps a pending intent of an ordered destination from its turn (None: nothing),
        naming the intent in the way only to a reader of its scope (``scopes``; None: every
        scope), as a destination's keys may be shared by several scopes' intents."""
        if intent.status is not Status.PENDING or intent.ordering_key is None:
            return None  # (nothing else can wait behind another: no read needed)
        blocker = await self.store.waiting_behind(intent.key)
        if blocker is None:
            return None
        if scopes is not None and blocker.scope not in scopes:
            return Behind(None, None, None)
        return Behind(blocker.action_id, blocker.scope, blocker.status)

    async def list_intents(self, query: IntentQuery) -> Page:
        """A page of intents, newest first."""
        if not 1 <= query.limit <= MAX_PAGE:
            raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}")
        for scope in query.scopes or ():  # (every store can then take them: no NUL, no odd length)
            check(SCOPE, scope, "scope")
        for name, value in (("created_after", query.created_after), ("created_before", query.created_before)):
            if value is not None:
                timestamps.checked(value, name)
        if query.destination is not None:
            check(DESTINATION_ID, query.destination, "destination")
        if query.channel is not None and query.channel not in channels.names():
            raise channels.UnknownChannel(f"there is no channel {query.channel!r}; installed: "
                                          + ", ".join(channels.names()))
        return await self.store.list_intents(query)

    # -- destinations --------------------------------------------------------------------

    async def put_destination(self, destination_id: str, spec: DestinationSpec, *,
                              owner: str | None = None) -> tuple[Destination, bool]:
        """Register or replace a destination; returns it and whether it was new.

        ``spec`` is checked by its channel's spec (a plain DestinationSpec carrying the channel's
        settings as further fields is checked here; raises pydantic's ValidationError). A
        destination keeps its channel: its intents' payloads were checked for that channel.
        Without a secret a new destination of a channel that needs one is refused and an
        existing one keeps its secrets. A new secret goes first; the previous ones stay for
        rotation (at most three kept) until ``drop_previous_secrets`` ends the rotation (as the
        channel's ``keep_secrets`` says, ``rotate_secrets`` unless it keeps secrets of two kinds),
        or, for a channel with a ``rotation_window``, until the window ends (the spec's
        ``rotation_window_seconds``, default the setting ``secret_rotation_seconds``).

        ``owner``: the scope that puts its own destination (``outbox.tenants``): it is checked as a
        tenant's (raises NotForTenants), kept within the tenant's limits (TenantLimit), and another
        scope's destination is, to it, not registered (NotFound). Without one (an admin), a
        destination keeps the owner it has; a new one is shared."""
        check(DESTINATION_ID, destination_id, "destination id")
        kind = channels.get(spec.channel)
        if not isinstance(spec, kind.spec):
            spec = kind.spec.model_validate(spec.model_dump(exclude_unset=True))
        existing = await self.store.get_destination(destination_id)
        if owner is not None:
            check(SCOPE, owner, "owner")
            if existing is not None and existing.owner != owner:
                raise NotFound(f"destination {destination_id!r} is not registered")
            spec = tenants.owned_spec(spec, owner, self.settings)
        if existing is not None and existing.channel != spec.channel:
            raise InvalidInput(f"destination {destination_id!r} is a {existing.channel} destination; a destination "
                               "keeps its channel: register the new one under another id")
        if spec.secret is None and existing is None and kind.needs_secret:
            raise InvalidInput(f"destination {destination_id!r} is new: it needs {kind.secret_form}")
        now = self.clock.now()
        held = existing.live_secrets(now) if existing and kind.rotation_window else existing.secrets if existing else ()
        secrets = kind.keep_secrets(held, spec)
        destination = Destination(
            id=destination_id,
            channel=spec.channel,
            settings=spec.settings(),
            secrets=secrets,
            idempotent=spec.idempotent,
            retention_seconds=spec.retention_seconds,
            on_unknown=spec.on_unknown,
            timeout_seconds=spec.timeout_seconds,
            requires_approval=spec.requires_approval,
            allow_private_network=spec.allow_private_network,
            disabled=spec.disabled,
            created_at=existing.created_at if existing else now,
            updated_at=now,
            reconcile=spec.reconcile,
            ordering=spec.ordering,
            ordering_on_dead=spec.ordering_on_dead,
            retry_schedule=None if spec.retry_schedule is None else tuple(spec.retry_schedule),
            max_age_seconds=spec.max_age_seconds,
            subscriptions=spec.subscribed(),
            rate_limit=spec.rate_limit,
            max_in_flight=spec.max_in_flight,
            paused_until=existing.paused_until if existing else None,
            owner=existing.owner if existing else owner,
            previous_secrets_until=self._rotation_ends(kind, held, secrets, existing, spec.rotation_window_seconds),
        )
        limits = tenants.TenantLimits.of(self.settings) if owner is not None else None
        created = await self.store.put_destination(destination, limits=limits)
        return destination, created

    def _rotation_ends(self, kind: channels.ChannelKind, held: tuple[str, ...], secrets: tuple[str, ...],
                       existing: Destination | None, window: float | None) -> datetime | None:
        """When the previous secrets of a destination now holding ``secrets`` (it held ``held``)
        stop signing: a window from now when a new secret was just put first, the window it had
        while the same one stays first, and None with one secret or for a channel without windows."""
        if not kind.rotation_window or len(secrets) < 2:
            return None
        if held[:1] == secrets[:1]:
            return existing.previous_secrets_until if existing else None
        seconds = self.settings.secret_rotation_seconds if window is None else window
        return self.clock.now() + timedelta(seconds=seconds)

    async def rotate_secret(self, destination_id: str, *, owner: str | None = None,
                            window_seconds: float | None = None) -> tuple[Destination, str]:
        """Give a destination a new secret made here, the previous one still signing beside it for
        ``window_seconds`` (default: ``secret_rotation_seconds``); returns the destination and the
        new secret, which is shown only here. ``owner``: as for ``put_destination`` (NotFound for
        another scope's). Raises InvalidInput for a channel that makes no secrets or keeps no windows."""
        existing = await self.get_destination(destination_id, owner=owner)
        kind = channels.get(existing.channel)
        if kind.new_secret is None or not kind.rotation_window:
            raise InvalidInput(f"the {existing.channel} channel makes no secrets to rotate; put the new one "
                               "with the destination")
        if window_seconds is not None and not 0 <= window_seconds <= MAX_ROTATION_SECONDS:
            raise InvalidInput(f"window_seconds must be from 0 to 30 days ({MAX_ROTATION_SECONDS})")
        now = self.clock.now()
        secret = kind.new_secret()
        held = existing.live_secrets(now)
        secrets = (secret, *held)[:KEPT_SECRETS]
        rotated = dataclasses.replace(existing, secrets=secrets, updated_at=now,
                                      previous_secrets_until=self._rotation_ends(kind, held, secrets, existing,
                                                                                 window_seconds))
        await self.store.put_destination(rotated)
        log.info("destination %s: secret rotated (the previous one signs until %s)", destination_id,
                 rotated.previous_secrets_until)
        return rotated, secret

    async def get_destination(self, destination_id: str, *, owner: str | None = None) -> Destination:
        """One destination (with ``owner``, only that scope's own). Raises NotFound."""
        check(DESTINATION_ID, destination_id, "destination id")
        found = await self.store.get_destination(destination_id)
        if found is None or (owner is not None and found.owner != owner):
            raise NotFound(f"destination {destination_id!r} is not registered")
        return found

    async def list_destinations(self, *, owner: str | None = None) -> list[Destination]:
        """Every destination (with ``owner``, that scope's own)."""
        if owner is not None:
            check(SCOPE, owner, "owner")
        return await self.store.list_destinations(owner=owner)

    async def delete_destination(self, destination_id: str, *, owner: str | None = None) -> None:
        """Remove a destination nothing refers to (with ``owner``, only that scope's own).
        Raises NotFound, DestinationInUse."""
        if owner is not None:
            await self.get_destination(destination_id, owner=owner)
        check(DESTINATION_ID, destination_id, "destination id")
        await self.store.delete_destination(destination_id)

    # -- grants ----------------------------------------------------------------------------

    async def put_grant(self, grant_id: str, spec: GrantSpec) -> tuple[Grant, bool]:
        """Create or replace a grant; returns it and whether it was new."""
        check(DESTINATION_ID, grant_id, "grant id")
        check(SCOPE, spec.scope, "scope")
        if spec.destination != "*":
            check(DESTINATION_ID, spec.destination, "destination")
            target = await self.store.get_destination(spec.destination)
            if target is None:
                raise UnknownDestination(f"destination {spec.destination!r} is not registered; register it first "
                                         "(a grant for it would silently apply to whatever is registered later)")
            if target.owner is not None and target.owner != spec.scope:
                raise OwnedDestination(f"destination {spec.destination!r} is owned by scope {target.owner!r}: only "
                                       "that scope's intents and events reach it, and no grant can widen that")
        return await self.store.put_grant(grant_id, spec, self.clock.now())

    async def get_grant(self, grant_id: str) -> Grant:
        """One grant. Raises NotFound."""
        check(DESTINATION_ID, grant_id, "grant id")
        found = await self.store.get_grant(grant_id)
        if found is None:
            raise NotFound(f"grant {grant_id!r} does not exist")
        return found

    async def list_grants(self) -> list[Grant]:
        """Every grant."""
        return await self.store.list_grants()

    async def delete_grant(self, grant_id: str) -> None:
        """Remove a grant: sends it allowed are refused from the next authority check on."""
        check(DESTINATION_ID, grant_id, "grant id")
        await self.store.delete_grant(grant_id)

    # -- tokens --------------------------------------------------------------------------

    async def create_token(
        self, role: Role, scopes: Sequence[str] = (), label: str | None = None, *, actor: str = "library"
    ) -> tuple[str, TokenInfo]:
        """A new API token; the token text is returned here and never again. Who made it
        (``actor``) is logged, as for every change to who may call the API."""
        if role is Role.PRODUCER and not scopes:
            raise InvalidInput("a producer token needs at least one scope (or '*' for all)")
        if role is Role.TENANT and (len(set(scopes)) != 1 or "*" in scopes):
            raise InvalidInput("a tenant token acts in exactly one scope: give it one (not '*')")
        if role not in (Role.PRODUCER, Role.TENANT) and scopes:
            raise InvalidInput(f"an {role.value} token acts in every scope; give it no scopes")
        for scope in scopes:
            if scope != "*":
                check(SCOPE, scope, "scope")
        if label is not None:
            check(TOKEN_LABEL, label, "label")
        token_id, token = new_token()
        info = TokenInfo(
            id=token_id,
            role=role,
            scopes=tuple(dict.fromkeys(scopes)),
            label=label,
            created_at=self.clock.now(),
            revoked_at=None,
        )
        await self.store.insert_token(info, hash_token(token))
        log.info("token %s (%s) created by %s", info.id, role.value, actor)
        return token, info

    async def authenticate(self, token: str, *, cached: bool = True) -> TokenInfo | None:
        """The active token this bearer string is, or None.

        A valid token is remembered for ``token_cache_seconds``, so a revocation made elsewhere
        takes effect within that time (at once with 0, or when not ``cached``: the console's
        sign-in, which opens a session for hours, asks the store); unknown tokens are never remembered.
        The cache (``TtlCache``, at most ``MAX_TOKENS``) is emptied on any revocation here.
        """
        token_hash = hash_token(token)
        known = self._tokens.get(token_hash, None) if cached else None
        if known is not None:
            return known
        asked = self._tokens.clock()
        info = await self.store.token_by_hash(token_hash)
        if info is None:
            self._tokens.pop(token_hash)
        else:
            self._tokens.put(token_hash, info, at=asked)
        return info

    async def list_tokens(self) -> list[TokenInfo]:
        """Every token (never their text)."""
        return await self.store.list_tokens()

    async def revoke_token(self, token_id: str, *, actor: str = "library", keep_an_admin: bool = True) -> TokenInfo:
        """Revoke a token (at once in this process), logging who did. Raises NotFound, and
        LastAdmin for the last active admin token unless ``keep_an_admin`` is False (the
        host's CLI, which can always create another)."""
        check(TOKEN_ID, token_id, "token id")
        info = await self.store.revoke_token(token_id, self.clock.now(), keep_an_admin=keep_an_admin)
        self._tokens.clear()
        log.info("token %s (%s) revoked by %s", info.id, info.role.value, actor)
        return info

    async def open_console_session(self, token: TokenInfo) -> str:
        """A new console sign-in with the active ``token``: its session id, returned here only
        (the store keeps its hash). It lasts ``console_session_seconds`` at most, ends sooner
        when closed or when the token is revoked, and the token's oldest session ends once it
        holds more than ``SESSIONS_PER_TOKEN``."""
        now = self.clock.now()
        session_id = new_session_id()
        session = ConsoleSession(hash_token(session_id), token.id, now,
                                 now + timedelta(seconds=self.settings.console_session_seconds))
        await self.store.open_console_session(session, keep=SESSIONS_PER_TOKEN)
        log.info("console session opened with token %s (%s)", token.id, token.role.value)
        return session_id

    async def console_session(self, session_id: str) -> TokenInfo | None:
        """The token a console session was opened with, while the session is open and the
        token active (read from the store every time: a revocation elsewhere ends it at once)."""
        return await self.store.console_session(hash_token(session_id), self.clock.now())

    async def close_console_session(self, session_id: str) -> None:
        """End a console session (signing out); an unknown one is already ended."""
        await self.store.close_console_session(hash_token(session_id))

    async def mint_portal_link(self, token: TokenInfo, scope: str, *, session_seconds: float | None = None,
                               read_only: bool = False) -> tuple[str, PortalLink]:
        """A new portal link for ``scope``, minted by the active ``token`` (an admin's, or a
        producer's that may act in ``scope``: the caller checks): its token, returned here only,
        and the link as stored. It opens once within ``portal_link_seconds``; its session lasts
        ``session_seconds`` (default and most: ``portal_session_seconds``)."""
        check(SCOPE, scope, "scope")
        most = self.settings.portal_session_seconds
        if session_seconds is not None and not 60 <= session_seconds <= most:
            raise InvalidInput(f"a portal session lasts 60 to {most:g} seconds (portal_session_seconds), "
                               f"not {session_seconds:g}")
        now = self.clock.now()
        link_token = new_link_token()
        link = PortalLink(hash_token(link_token), token.id, scope, read_only, int(session_seconds or most), now,
                          now + timedelta(seconds=self.settings.portal_link_seconds))
        await self.store.insert_portal_link(link)
        log.info("portal link for scope %s minted by token %s (%s)", scope, token.id,
                 "read-only" if read_only else "read-write")
        return link_token, link

    async def open_portal_link(self, link_token: str) -> tuple[str, PortalSession] | None:
        """Open a portal link, once: the new session's id (returned here only) and the session, or
        None for a link expired, opened already, minted by a token since revoked, or unknown."""
        session_id = new_session_id()
        session = await self.store.open_portal_link(hash_token(link_token), hash_token(session_id), self.clock.now())
        return None if session is None else (session_id, session)

    async def portal_session(self, session_id: str) -> PortalSession | None:
        """The portal session with this id while it is open (read from the store every time)."""
        return await self.store.portal_session(hash_token(session_id), self.clock.now())

    async def close_portal_session(self, session_id: str) -> None:
        """End a portal session (signing out); an unknown one is already ended."""
        await self.store.close_portal_session(hash_token(session_id))


class OutboxTransaction(PublishingTransaction):
    """The caller's SQL and the outbox's enqueues (and publishes) in one database transaction."""

    def __init__(self, outbox: Outbox, tx: Transaction) -> None:
        self._outbox = outbox
        self._tx = tx

    async def execute(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run the caller's own statement (placeholders of the store's dialect)."""
        return await self._tx.execute(sql, parameters)

    async def enqueue(self, **intent: Unpack[IntentFields]) -> Enqueued:
        """As ``Outbox.enqueue``; durable when the transaction commits."""
        new, event = self._outbox.prepare(**intent)
        return await self._tx.insert_intent(new, event)


@dataclass(frozen=True, slots=True)
class Behind:
    """The intent a pending one waits behind (its key's earliest in the way); all None when the
    reader may not know it (another scope's)."""

    action_id: str | None
    scope: str | None
    status: Status | None

    def text(self, intent: Intent) -> str:
        """``behind <action_id>`` (and its scope and status when they tell more), as the CLI and
        console say it."""
        if self.action_id is None:
            return "behind an earlier intent"
        where = f" in scope {self.scope}" if self.scope != intent.scope else ""
        return f"behind {self.action_id}{where}" + (f" ({self.status.value})" if self.status else "")
