"""The process's secrets key, as it opens a store and rotates: where its key file is, the
unlocking of an opened store with it (``Outbox.open``, ``outbox migrate``), and the rotation
to a new key (``outbox secrets rotate``). Above the store, which it drives; the sealing itself
is ``outbox.keyring``, below the store, which seals and opens with it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import SecretsKeyError
from .keyring import Keyring, generate_key, key_lines, required, write_keys

if TYPE_CHECKING:
    from .settings import Settings
    from .store.protocol import Store

log = logging.getLogger("outbox.keyring")


def key_file(settings: Settings, store: Store) -> tuple[Path, bool]:
    """Where this process's keys are, and whether the outbox manages that file: the one
    ``secrets_key_file`` names, else the embedded store's default beside its database file
    (``outbox.db`` → ``outbox.key``). Raises SecretsKeyError on a store with no default
    (PostgreSQL: the operator gives every process the key)."""
    from .store.sqlite import SqliteStore

    if settings.secrets_key_file is not None:
        return settings.secrets_key_file.absolute(), False
    if not isinstance(store, SqliteStore):
        raise SecretsKeyError(
            "OUTBOX_SECRETS_KEY_FILE is not set: on PostgreSQL every process needs the file with the key that seals "
            "destination secrets (make one with `outbox secrets generate-key > FILE`, chmod 600, and give every "
            "process the same file)")
    database = store.path.absolute()
    path = database.with_suffix(".key")
    if path == database:
        raise SecretsKeyError(f"the database {database} is named like a key file: name it otherwise, or set "
                              "OUTBOX_SECRETS_KEY_FILE")
    return path, True


async def unlock(store: Store, settings: Settings) -> Keyring:
    """Give the opened, migrated ``store`` this process's keyring, after checking that it holds
    the key the database seals with; the embedded default makes its key file on first start.
    Secrets still stored plain (by an older release) are sealed now. Raises SecretsKeyError with
    what to do when the key file is missing, unreadable or the wrong one."""
    path, managed = key_file(settings, store)
    recorded = await store.sealing_key()
    if not path.exists():
        if not managed:
            raise SecretsKeyError(f"OUTBOX_SECRETS_KEY_FILE names {path}, which does not exist")
        if recorded is not None:
            raise SecretsKeyError(f"the destination secrets in this database are sealed under key {recorded}, but "
                                  f"its key file {path} is missing: restore it from its backup (a new key cannot "
                                  "open them)")
        if write_keys(path, [generate_key()], replace=False):
            log.info("made the secrets key file %s: back it up apart from the database", path)
    keyring = Keyring.read(path, managed=managed)
    key = keyring.sealing(recorded)
    store.keyring = keyring
    if sealed := await store.reseal_secrets(key, plain_only=True):
        log.info("sealed the secrets of %d destinations stored in plain text by an older release", sealed)
    return keyring


@dataclass(frozen=True, slots=True)
class Rotation:
    """What ``rotate`` did: the key now sealing, the one before, and how many destinations'
    secrets it sealed again."""

    key: str
    previous: str | None
    resealed: int
    key_file: Path | None

    def json(self) -> Mapping[str, Any]:
        return {"key": self.key, "previous_key": self.previous, "resealed": self.resealed,
                "key_file": str(self.key_file) if self.key_file else None}


async def rotate(store: Store) -> Rotation:
    """Seal every destination's secrets under the first key of the key file, in one transaction
    that also makes it the database's sealing key. On the embedded default's own key file, a new
    key is made first (when the first key already seals), kept beside the old ones until the
    transaction committed, and then left alone in the file. Raises SecretsKeyError when there is
    no other key to rotate to, or some destination's secrets cannot be opened (nothing changes)."""
    keyring = required(store.keyring)
    keyring.reload()  # the file as it is now: the operator may have put a new key first
    previous = await store.sealing_key()
    if keyring.managed and keyring.path is not None and keyring.primary == previous:
        write_keys(keyring.path, [generate_key(), *key_lines(keyring.path)], replace=True)
        keyring.reload()
    target = keyring.primary
    if target == previous:
        raise SecretsKeyError(f"the first key of {keyring.path or 'the keyring'} ({target}) already seals the "
                              "secrets: put the new key first in the file (`outbox secrets generate-key`), give it "
                              "to every process, then rotate")
    resealed = await store.reseal_secrets(target)
    if keyring.managed and keyring.path is not None:
        write_keys(keyring.path, key_lines(keyring.path)[:1], replace=True)
    return Rotation(target, previous, resealed, keyring.path)
