"""A store that notes which protocol methods are called through it, so the conformance suite can
prove it exercises every method of ``outbox.store.protocol``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from outbox.store import Store, Transaction


def protocol_methods(protocol: type) -> set[str]:
    """The public methods a Protocol class declares, with those of the protocols it joins (the
    store's roles)."""
    return {name for cls in protocol.__mro__ if cls.__module__ == protocol.__module__
            for name, value in vars(cls).items() if callable(value) and not name.startswith("_")}


#: Every method the suite must call: the store's, and the transaction's as ``transaction().NAME``.
REQUIRED: frozenset[str] = frozenset(
    protocol_methods(Store) | {f"transaction().{name}" for name in protocol_methods(Transaction)})


class Recording:
    """An object whose protocol method calls are added to ``calls`` (as ``prefix`` + the method's
    name); anything else passes through."""

    def __init__(self, target: Any, calls: set[str], prefix: str = "") -> None:
        self._target = target
        self._calls = calls
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        label = self._prefix + name
        if label not in REQUIRED:
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.add(label)
            return value(*args, **kwargs)

        return call


class RecordingStore(Recording):
    """A store whose protocol method calls, its transactions' included, are added to ``calls``."""

    def __init__(self, store: Store, calls: set[str]) -> None:
        super().__init__(store, calls)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Recording]:
        self._calls.add("transaction")
        async with self._target.transaction() as tx:
            yield Recording(tx, self._calls, "transaction().")
