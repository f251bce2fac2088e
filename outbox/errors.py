"""Errors raised by the outbox.

    OutboxError
    ├── InvalidInput            the caller's data is malformed (bad id, payload not I-JSON, ...)
    │   ├── PayloadTooLarge     the canonical payload exceeds the configured limit
    │   └── FanoutTooLarge      an event would make more intents than the configured limit
    ├── NotFound                no such intent, destination or token
    ├── UnknownDestination      enqueue named a destination that is not registered
    ├── IntentConflict          same scope and action_id, another destination or payload digest
    ├── AmbiguousActionId       an action id used in several scopes was named without its scope
    ├── DestinationInUse        a destination still has intents waiting to be delivered
    ├── OwnedDestination        a grant would let another scope reach a tenant's own destination
    ├── TenantLimit             a tenant holds as many destinations or subscriptions as it may
    ├── NotForTenants           a setting a tenant's own destination may not have
    ├── LastAdmin               revoking this token would leave no active admin token
    ├── IllegalTransition       a status change the lifecycle does not allow
    ├── StaleWrite              the row changed under us (status or fence moved on)
    ├── DuplicateRisk           a replay could duplicate an effect the destination won't dedupe
    ├── AuthorityDenied         the authority provider still denies the intent
    ├── NoTransaction           an enqueue on the caller's connection found no transaction to join
    ├── StoreUnavailable        the database is locked, full or unreachable; retry later
    │   └── NoDatabase          opened not to create one, and there is none at its URL
    ├── SchemaTooNew            the database was migrated by a newer release
    └── SecretsKeyError         the key sealing destination secrets is missing, wrong or unreadable

Each subclass's docstring is its default message; raise with a specific one when it helps the
user act (``UnknownDestination("destination 'billing' is not registered")``). An error that
carries figures the caller may act on gives them in ``details`` too (an API problem's fields).
"""

from __future__ import annotations

from typing import Any


class OutboxError(Exception):
    """Outbox error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])

    def details(self) -> dict[str, Any]:
        """What the error says beside its message, by name (none unless a subclass says)."""
        return {}


class InvalidInput(OutboxError):
    """The input is not valid."""


class PayloadTooLarge(InvalidInput):
    """The payload is larger than the configured limit."""


class FanoutTooLarge(InvalidInput):
    """The event would fan out to more destinations than the configured limit allows."""

    def __init__(self, message: str | None = None, *, fanout: int = 0, max_fanout: int = 0) -> None:
        super().__init__(message)
        self.fanout = fanout  # the destinations it would have made an intent for
        self.max_fanout = max_fanout

    def details(self) -> dict[str, Any]:
        return {"fanout": self.fanout, "max_fanout": self.max_fanout}


class NotFound(OutboxError):
    """Not found."""


class UnknownDestination(OutboxError):
    """The destination is not registered."""


class IntentConflict(OutboxError):
    """An intent with this scope and action_id exists with another destination or payload."""


class AmbiguousActionId(OutboxError):
    """This action id is used in several scopes; name the scope too."""


class DestinationInUse(OutboxError):
    """The destination still has intents waiting to be delivered."""


class OwnedDestination(OutboxError):
    """The destination is owned by one scope: only that scope's intents and events reach it."""


class TenantLimit(OutboxError):
    """The tenant holds as many destinations or subscriptions as it may."""

    def __init__(self, message: str | None = None, *, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit}


class NotForTenants(OutboxError):
    """A tenant's own destination may not have this setting; an admin decides it."""


class LastAdmin(OutboxError):
    """This is the last active admin token; create another admin token before revoking it."""


class IllegalTransition(OutboxError):
    """The intent lifecycle does not allow this status change."""


class StaleWrite(OutboxError):
    """The intent changed since it was read; the write was not applied."""


class DuplicateRisk(OutboxError):
    """An earlier attempt may have taken effect and the destination does not deduplicate."""


class AuthorityDenied(OutboxError):
    """The authority provider still denies this intent."""


class NoTransaction(OutboxError):
    """The connection has no transaction open: the intent would commit alone; enqueue inside yours."""


class StoreUnavailable(OutboxError):
    """The database is unavailable (locked, full or unreachable); retry later."""


class NoDatabase(StoreUnavailable):
    """There is no outbox database there, and it was opened not to create one."""


class SchemaTooNew(OutboxError):
    """The database schema is newer than this release understands; upgrade the outbox."""


class SecretsKeyError(OutboxError):
    """The key that seals destination secrets is missing, wrong or unreadable."""
