"""A broker destination's secrets: the signing secrets of its messages (``whsec_``, newest first,
rotated as a webhook's) and, after them, the password it connects with, if any. Both are sealed
at rest with every other secret; a password is write-only in the API and kept when an update
leaves it out."""

from __future__ import annotations

from outbox import DestinationSpec
from outbox.destinations import rotate_secrets
from receivers import wire


def split(secrets: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """``secrets`` as the signing secrets (newest first) and the password: the first secret not
    in the signing secrets' form."""
    signing = tuple(s for s in secrets if s.startswith(wire.SECRET_PREFIX))
    return signing, next((s for s in secrets if not s.startswith(wire.SECRET_PREFIX)), None)


def kept(held: tuple[str, ...], spec: DestinationSpec, *, password: str | None, uses_password: bool) -> tuple[str, ...]:
    """What a destination holds once ``spec`` replaces it: its signing secrets rotated as a
    webhook's, then the ``password`` given or else the one held, while it ``uses_password``."""
    signing, held_password = split(held)
    password = password or held_password
    return rotate_secrets(signing, spec) + ((password,) if password is not None and uses_password else ())


def signing_secret(secret: str | None, *, password: str) -> str | None:
    """A spec's ``secret``: the messages' signing secret, in a webhook's form; the password is
    given in its own field, which ``password`` names ("the SASL password as sasl_password")."""
    if secret is not None and not secret.startswith(wire.SECRET_PREFIX):
        raise ValueError(f"secret is the {wire.SECRET_PREFIX} signing secret of the messages; give {password}")
    return None if secret is None else wire.check_secret(secret)


def password(value: str | None) -> str | None:
    """A spec's password validator: never in the signing secrets' form, which would read as one."""
    if value is not None and value.startswith(wire.SECRET_PREFIX):
        raise ValueError(f"a password must not start with {wire.SECRET_PREFIX!r}, the signing secrets' form")
    return value
