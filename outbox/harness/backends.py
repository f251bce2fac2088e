"""Where a harness's intents are recorded: a served outbox over HTTP (``Served``, through
``outbox.client``) or an outbox opened in the harness's own process (``Local``, the library).
Both answer with the client's ``Intent``, attempts included, so the answers are made one way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..client import AsyncClient, Intent, NotFound, WaitTimeout
from ..errors import NotFound as LibraryNotFound
from .actions import Action

if TYPE_CHECKING:
    from ..outbox import Outbox


class Backend(Protocol):
    """What a harness asks of the outbox. ``wait`` returns the intent as it stands when the time
    is up (settled or not); ``find`` returns None for an action id the outbox has never seen."""

    async def enqueue(self, action: Action) -> Intent: ...

    async def find(self, action_id: str, scope: str) -> Intent | None: ...

    async def wait(self, action_id: str, scope: str, timeout: float) -> Intent: ...

    async def approve(self, action_id: str, scope: str, payload_digest: str, reason: str) -> Intent: ...

    async def reject(self, action_id: str, scope: str, reason: str) -> Intent: ...

    async def aclose(self) -> None: ...


class Served:
    """A served outbox (``outbox serve``) at ``url``, with a producer ``token`` (default
    ``OUTBOX_TOKEN``) for the harness's scopes, and an operator's ``approver_token`` for the
    approvals given through the harness (without it, approving raises ``ValueError``)."""

    def __init__(self, url: str, *, token: str | None = None, approver_token: str | None = None,
                 timeout: float = 10.0) -> None:
        self.client = AsyncClient(url, token=token, timeout=timeout)
        self._approver = AsyncClient(url, token=approver_token, timeout=timeout) if approver_token else None

    async def enqueue(self, action: Action) -> Intent:
        return (await self.client.enqueue(action.destination, dict(action.arguments), scope=action.scope,
                                          action_id=action.action_id)).intent

    async def find(self, action_id: str, scope: str) -> Intent | None:
        try:
            return await self.client.get(action_id, scope=scope)
        except NotFound:
            return None

    async def wait(self, action_id: str, scope: str, timeout: float) -> Intent:
        try:
            return await self.client.wait(action_id, scope=scope, timeout=timeout)
        except WaitTimeout as unsettled:
            return unsettled.intent

    async def approve(self, action_id: str, scope: str, payload_digest: str, reason: str) -> Intent:
        return await self._operator().approve(action_id, payload_digest=payload_digest, reason=reason, scope=scope)

    async def reject(self, action_id: str, scope: str, reason: str) -> Intent:
        return await self._operator().reject(action_id, reason=reason, scope=scope)

    def _operator(self) -> AsyncClient:
        if self._approver is None:
            raise ValueError("approving through the harness needs an operator's token: Served(..., approver_token=...)")
        return self._approver

    async def aclose(self) -> None:
        await self.client.close()
        if self._approver is not None:
            await self._approver.close()


class Local:
    """An outbox opened in this process (``await Outbox.open(url)``); approvals are recorded as
    ``actor``'s."""

    def __init__(self, box: Outbox, *, actor: str = "harness") -> None:
        self.box = box
        self.actor = actor

    async def enqueue(self, action: Action) -> Intent:
        """The intent as enqueued, without its attempts (``wait`` reads them), as over HTTP."""
        from ..shapes import intent_json

        enqueued = await self.box.enqueue(destination=action.destination, scope=action.scope,
                                          payload=dict(action.arguments), action_id=action.action_id,
                                          actor=self.actor)
        return Intent.of(intent_json(enqueued.intent))

    async def find(self, action_id: str, scope: str) -> Intent | None:
        try:
            return await self._shown(action_id, scope)
        except LibraryNotFound:
            return None

    async def wait(self, action_id: str, scope: str, timeout: float) -> Intent:
        await self.box.wait(action_id, timeout, scope=scope)
        return await self._shown(action_id, scope)

    async def approve(self, action_id: str, scope: str, payload_digest: str, reason: str) -> Intent:
        from .. import operations

        await operations.approve(self.box, action_id, operations.Actor(self.actor, reason), scope=scope,
                                 payload_digest=payload_digest)
        return await self._shown(action_id, scope)

    async def reject(self, action_id: str, scope: str, reason: str) -> Intent:
        from .. import operations

        await operations.reject(self.box, action_id, operations.Actor(self.actor, reason), scope=scope)
        return await self._shown(action_id, scope)

    async def _shown(self, action_id: str, scope: str) -> Intent:
        from ..shapes import history_json, intent_json

        intent, history = await self.box.show(action_id, scope=scope)
        return Intent.of({**intent_json(intent), **history_json(history)})

    async def aclose(self) -> None:
        """The outbox is the caller's: it stays open."""
