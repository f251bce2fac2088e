"""RFC 9457 problem details: every API error is ``application/problem+json`` with a useful detail."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from receivers.wire import PROBLEM_TYPE_PREFIX as TYPE_PREFIX  # one namespace: the API's and the receivers' problems

from .. import errors

MEDIA_TYPE = "application/problem+json"


class Problem(Exception):
    """An HTTP error answered as problem+json. ``kind`` becomes the ``type`` URI's last part."""

    def __init__(
        self,
        status: int,
        kind: str,
        title: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.headers = dict(headers or {})
        self.extensions = extensions

    def json(self, instance: str | None = None) -> dict[str, Any]:
        """The problem's body (also an item's answer in a batch)."""
        body: dict[str, Any] = {
            "type": TYPE_PREFIX + self.kind,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extensions)
        return body

    def response(self, instance: str | None = None) -> Response:
        return Response(
            json.dumps(self.json(instance)), status_code=self.status, headers=self.headers, media_type=MEDIA_TYPE
        )


#: How the outbox's own errors are answered: status, type, title.
_ANSWERS: list[tuple[type[errors.OutboxError], int, str, str]] = [
    (errors.PayloadTooLarge, 413, "payload-too-large", "Payload too large"),
    (errors.FanoutTooLarge, 422, "fanout-too-large", "Fan-out over the limit"),
    (errors.InvalidInput, 422, "invalid-input", "Invalid input"),
    (errors.NotFound, 404, "not-found", "Not found"),
    (errors.UnknownDestination, 422, "unknown-destination", "Unknown destination"),
    (errors.IntentConflict, 409, "intent-conflict", "Action id already used for another operation"),
    (errors.AmbiguousActionId, 409, "ambiguous-action-id", "Action id used in several scopes"),
    (errors.DestinationInUse, 409, "destination-in-use", "Destination in use"),
    (errors.OwnedDestination, 409, "owned-destination", "Destination owned by one scope"),
    (errors.TenantLimit, 409, "tenant-limit", "Tenant limit reached"),
    (errors.NotForTenants, 403, "not-for-tenants", "Not a tenant's setting"),
    (errors.LastAdmin, 409, "last-admin", "Last admin token"),
    (errors.IllegalTransition, 409, "illegal-transition", "Illegal status change"),
    (errors.StaleWrite, 409, "stale-write", "The intent changed meanwhile"),
    (errors.DuplicateRisk, 409, "duplicate-risk", "Replay could duplicate an effect"),
    (errors.AuthorityDenied, 409, "authority-denied", "Authority still denied"),
    (errors.StoreUnavailable, 503, "store-unavailable", "Store unavailable"),
    (errors.SchemaTooNew, 503, "schema-too-new", "Database schema is newer than this release"),
    (errors.SecretsKeyError, 503, "secrets-key", "The key sealing destination secrets is not at hand"),
]


def from_error(exc: errors.OutboxError) -> Problem:
    """The problem an outbox error is answered with (its ``details`` as the problem's fields)."""
    for cls, status, kind, title in _ANSWERS:
        if isinstance(exc, cls):
            headers = {"Retry-After": "1"} if status == 503 else None
            return Problem(status, kind, title, exc.message, headers=headers, **exc.details())
    return Problem(500, "internal", "Internal error", exc.message)
