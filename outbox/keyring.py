"""The keyring: the keys that seal destination secrets at rest.

Webhook signing secrets and SMTP and SASL passwords are stored sealed with AES-256-GCM (the
``cryptography`` package) under a key the operator holds, so a copy of the database alone
reveals none of them. The database names the key it seals with (``secrets_key``: its id, never
the key). A keyring is the keys one process holds, read from a key file: one key a line (32
random bytes in base64, as ``outbox secrets generate-key`` or ``openssl rand -base64 32`` print
it), ``#`` comments and blank lines ignored. A process seals with the key the database names and
opens a value with the key the value names, so processes sharing one PostgreSQL never need their
files in the same order; the first key of a file is only what ``outbox secrets rotate`` moves to.

A destination's secrets are stored as JSON,
``{"alg": "A256GCM", "key": "<key id>", "sealed": "<base64: nonce, ciphertext, tag>"}``, with
the destination's id as associated data, so a sealed value copied onto another destination does
not open. A JSON list is the plain form releases before sealing wrote: it is read as it is, and
sealed when the outbox next opens the database (``unlock``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import SecretsKeyError

log = logging.getLogger("outbox.keyring")

ALGORITHM = "A256GCM"
#: A key as a file holds it: 32 bytes in standard base64 (with its one ``=`` of padding).
KEY = re.compile(r"[A-Za-z0-9+/]{43}=")
#: Bound into every sealed value with the destination's id, so it opens only there.
CONTEXT = b"outbox-delivery destination secrets\x00"
NONCE_BYTES = 12
#: What the outbox writes at the top of a key file it makes.
HEADER = ("# outbox-delivery: the key that seals destination secrets in the database beside this file.\n"
          "# Back it up apart from the database: a copy of the database opens only with it.\n")


def generate_key() -> str:
    """A new random key, as a key file holds it."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


def key_id(key: bytes) -> str:
    """A key's public name (16 hex digits), derived from the key so that a wrong key shows as
    another id: what the database records and errors name, never the key itself."""
    return hmac.new(key, b"outbox-delivery secrets key id", hashlib.sha256).hexdigest()[:16]


def parse_keys(text: str, source: str) -> list[bytes]:
    """The keys a key file's text holds, in order. Raises SecretsKeyError naming the line (never
    its text, which may be a key) that is not a key, or a file with no key."""
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not KEY.fullmatch(line):
            raise SecretsKeyError(f"line {number} of {source} is not a key (32 bytes in base64, one a line, "
                                  "as `outbox secrets generate-key` prints it)")
        keys.append(base64.b64decode(line))
    if not keys:
        raise SecretsKeyError(f"{source} holds no key")
    return keys


class Keyring:
    """The keys one process holds: each opens what it sealed. A keyring read from a file reads
    it again when asked for a key it does not hold (a rotation may have added it there)."""

    def __init__(self, keys: Sequence[bytes], *, path: Path | None = None, managed: bool = False) -> None:
        if not keys:
            raise SecretsKeyError("a keyring needs at least one key")
        #: The file the keys came from, and whether the outbox made it (and may rewrite it).
        self.path = path
        self.managed = managed
        self._keys = self._index(keys)
        self._order = [key_id(k) for k in keys]

    @staticmethod
    def _index(keys: Sequence[bytes]) -> dict[str, AESGCM]:
        if any(len(k) != 32 for k in keys):
            raise SecretsKeyError("a key is 32 bytes")
        return {key_id(k): AESGCM(k) for k in keys}

    @classmethod
    def read(cls, path: Path, *, managed: bool = False) -> Keyring:
        """The keys of the file at ``path``. Raises SecretsKeyError when it cannot be read or
        holds anything but keys."""
        return cls(_read_keys(path), path=path, managed=managed)

    @property
    def primary(self) -> str:
        """The id of the first key: the one ``outbox secrets rotate`` seals under."""
        return self._order[0]

    @property
    def ids(self) -> tuple[str, ...]:
        """The ids of the keys held, in the file's order."""
        return tuple(self._order)

    def reload(self) -> None:
        """Read the key file again (what it holds now replaces what it held). Raises
        SecretsKeyError when it cannot be read or holds anything but keys."""
        if self.path is not None:
            keys = _read_keys(self.path)
            self._keys, self._order = self._index(keys), [key_id(k) for k in keys]

    def holds(self, key: str) -> bool:
        """Whether the key named ``key`` is held, reading the file again if it is not."""
        if key not in self._keys:
            try:
                self.reload()
            except SecretsKeyError as exc:
                log.warning("could not read the secrets key file again: %s", exc)
        return key in self._keys

    def sealing(self, recorded: str | None) -> str:
        """The key to seal with: the one the database records (``recorded``), or this keyring's
        first when it records none yet. Raises SecretsKeyError when the recorded one is not held."""
        if recorded is None:
            return self.primary
        if not self.holds(recorded):
            raise SecretsKeyError(self._missing(recorded, "the database seals destination secrets under key"))
        return recorded

    def seal(self, values: Sequence[str], *, destination_id: str, key: str) -> str:
        """``values`` (a destination's secrets) sealed under ``key``, as stored."""
        if not self.holds(key):
            raise SecretsKeyError(self._missing(key, "sealing needs key"))
        nonce = os.urandom(NONCE_BYTES)
        box = self._keys[key].encrypt(nonce, json.dumps(list(values)).encode(), CONTEXT + destination_id.encode())
        return json.dumps({"alg": ALGORITHM, "key": key, "sealed": base64.b64encode(nonce + box).decode()})

    def open(self, stored: str, *, destination_id: str) -> tuple[str, ...]:
        """A destination's secrets from their stored form (sealed, or the plain list of an older
        release). Raises SecretsKeyError, naming the destination and the key, never a secret."""
        value = _stored(stored, destination_id)
        if isinstance(value, list):
            return tuple(value)
        key = value["key"]
        if not self.holds(key):
            raise SecretsKeyError(self._missing(key, f"the secrets of destination {destination_id!r} are sealed "
                                                     "under key"))
        try:
            raw = base64.b64decode(value["sealed"], validate=True)
            opened = json.loads(self._keys[key].decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:],
                                                        CONTEXT + destination_id.encode()))
        except (InvalidTag, binascii.Error, ValueError) as exc:
            raise SecretsKeyError(f"the secrets of destination {destination_id!r} do not open under key {key}: "
                                  "the stored value was altered or belongs to another destination") from exc
        return tuple(opened)

    def resealed(self, stored: str, *, destination_id: str, key: str, plain_only: bool = False) -> str | None:
        """What to store instead of ``stored`` so that it is sealed under ``key``, or None when it
        already is (or, with ``plain_only``, when it is sealed at all)."""
        value = _stored(stored, destination_id)
        if isinstance(value, dict) and (plain_only or value["key"] == key):
            return None
        return self.seal(self.open(stored, destination_id=destination_id), destination_id=destination_id, key=key)

    def _missing(self, key: str, what: str) -> str:
        held = ", ".join(self._order)
        where = f"the key file {self.path}" if self.path else "this keyring"
        return (f"{what} {key}, which {where} does not hold (it holds {held}): give every process the key file "
                "the database was sealed with")


def required(keyring: Keyring | None) -> Keyring:
    """A store's keyring, which it needs to read or write secrets. Raises SecretsKeyError when
    it has none (a store opened other than by ``Outbox.open`` is given one by its opener)."""
    if keyring is None:
        raise SecretsKeyError("the store has no keyring to open destination secrets with: open it with Outbox.open")
    return keyring


def _stored(stored: str, destination_id: str) -> list[str] | dict[str, Any]:
    """A stored secrets value as JSON: a plain list of strings, or a sealed object."""
    try:
        value = json.loads(stored)
    except ValueError:
        value = None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if (isinstance(value, dict) and value.get("alg") == ALGORITHM and isinstance(value.get("key"), str)
            and isinstance(value.get("sealed"), str)):
        return value
    raise SecretsKeyError(f"the stored secrets of destination {destination_id!r} are in no form this release reads")


def _read_keys(path: Path) -> list[bytes]:
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretsKeyError(f"cannot read the secrets key file {path}: {getattr(exc, 'strerror', None) or exc}"
                              ) from None
    if stat.S_IMODE(mode) & 0o007:  # (group-readable is how Kubernetes mounts it for the pod's group)
        log.warning("every user of this host can read the secrets key file %s (mode %o): chmod 600 it",
                    path, stat.S_IMODE(mode))
    return parse_keys(text, str(path))


def write_keys(path: Path, keys: Sequence[str], *, replace: bool) -> bool:
    """Write a key file (mode 0600) whole or not at all: to a temporary file beside it, synced,
    then moved into place (``replace``) or linked there only if there is none yet. Returns False
    when, not replacing, another process made the file first. Raises SecretsKeyError when the
    file cannot be written."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(HEADER + "".join(f"{k}\n" for k in keys))
                out.flush()
                os.fsync(out.fileno())
            if replace:
                os.replace(temporary, path)
            else:
                try:
                    os.link(temporary, path)
                except FileExistsError:
                    return False
        finally:
            temporary.unlink(missing_ok=True)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise SecretsKeyError(f"cannot write the secrets key file {path}: {exc.strerror or exc}") from None
    return True


def key_lines(path: Path) -> list[str]:
    """The keys of the file at ``path``, as its lines hold them."""
    return [base64.b64encode(k).decode() for k in _read_keys(path)]
