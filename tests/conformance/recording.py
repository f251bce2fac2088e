"""A store that notes which protocol methods are called through it, so the conformance suite can
prove it exercises every method of ``outbox.store.protocol``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from outbox.store import Store, Transaction


def protocol_methods(protocol: type) -> set[str]:
    """The public methods a Protocol class declares."""
    return {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}


#: Every method the suite must call: the store's, and the transaction's as ``transaction().NAME``.
REQUIRED: frozenset[str] = frozenset(
    protocol_methods(Store) | {f"transaction().{name}" for name in protocol_methods(Transaction)}
)


def _recorded(calls: set[str], name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.add(name)
        return method(*args, **kwargs)

    return call


class RecordingTransaction:
    """A transaction whose protocol method calls are added to ``calls``."""

    def __init__(self, tx: Transaction, calls: set[str]) -> None:
        self._tx = tx
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tx, name)
        label = f"transaction().{name}"
        return _recorded(self._calls, label, value) if label in REQUIRED else value


class RecordingStore:
    """A store whose protocol method calls are added to ``calls``; anything else passes through."""

    def __init__(self, store: Store, calls: set[str]) -> None:
        self._store = store
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        return _recorded(self._calls, name, value) if name in REQUIRED else value

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[RecordingTransaction]:
        self._calls.add("transaction")
        async with self._store.transaction() as tx:
            yield RecordingTransaction(tx, self._calls)
