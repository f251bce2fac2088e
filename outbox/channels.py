"""The channel registry: which channels exist, and what the core must know of each.

A channel is one module (the webhook channel is ``sender.webhook``) that declares itself under
the ``outbox.channels`` entry-point group of its distribution. The core never imports a
channel by name: it asks this registry, which loads a channel's module the first time that
channel is named, so a process that only ever sends webhooks never imports another channel's
driver.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import InvalidInput

if TYPE_CHECKING:  # (imported when used: naming a channel needs no destination models, as the CLI's --help shows)
    from importlib.metadata import EntryPoint

    from .destinations import Destination, DestinationSpec

#: The entry-point group a channel's module registers its ``ChannelKind`` under.
ENTRY_POINTS = "outbox.channels"
#: The channel of a destination registered without naming one.
DEFAULT = "webhook"


def _rotated(held: tuple[str, ...], spec: Any) -> tuple[str, ...]:
    """``destinations.rotate_secrets``: what most channels keep of a destination's secrets."""
    from .destinations import rotate_secrets

    return rotate_secrets(held, spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelKind:
    """What the core needs of a channel: its ``name``, the ``spec`` a destination of it is
    registered with (the common fields plus its own settings and the form of its secret),
    whether a new destination must be given a secret (``secret_form`` names it for an error
    message) and how to make one if the channel can
    (a signing key), ``keep_secrets``, which says what a destination holds once a spec replaces
    it (a channel with secrets of two kinds keeps each apart), ``signing``, which of the secrets
    a destination holds sign what it is sent (the others are the channel's credentials: an SMTP
    or SASL password), ``rotation_window``, whether a rotation's previous secrets stop signing
    once its window ends (``Destination.live_secrets``: every secret it holds signs), and
    ``check_payload``, which raises
    ValueError for a payload the channel could never deliver, so it is refused at enqueue
    rather than dead-lettered later, and ``target``, which says in words where a destination of it
    delivers (a webhook's URL), from its settings: each attempt records it as it starts. The
    sender's half (how to send) extends this class."""

    name: str
    spec: type[DestinationSpec]
    needs_secret: bool = True
    secret_form: str = "a secret"
    new_secret: Callable[[], str] | None = None
    keep_secrets: Callable[[tuple[str, ...], Any], tuple[str, ...]] = _rotated
    signing: Callable[[tuple[str, ...]], tuple[str, ...]] = lambda secrets: secrets  # default: every one signs
    rotation_window: bool = False
    check_payload: Callable[[Any], None] | None = None  # None: every JSON payload is deliverable
    target: Callable[[Mapping[str, Any]], str] | None = None  # None: the channel's name says it all


class UnknownChannel(InvalidInput):
    """No channel of this name is installed."""


_kinds: dict[str, ChannelKind] = {}
_lock = threading.Lock()


@functools.cache
def _declared() -> dict[str, EntryPoint]:
    """The channels installed distributions declare, read once per process."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}


def names() -> tuple[str, ...]:
    """Every installed channel's name, sorted; loads none of them."""
    return tuple(sorted({*_kinds, *_declared()}))


def get(name: str) -> ChannelKind:
    """The channel called ``name``, loading its module the first time. Raises UnknownChannel."""
    kind = _kinds.get(name)
    if kind is not None:
        return kind
    with _lock:
        if name not in _kinds:
            declared = _declared().get(name)
            if declared is None:
                raise UnknownChannel(
                    f"there is no channel {name!r}; installed: {', '.join(names()) or 'none'}")
            loaded = declared.load()
            if not isinstance(loaded, ChannelKind) or loaded.name != name:
                raise TypeError(f"entry point {name!r} of {ENTRY_POINTS} is {loaded!r}, "
                                f"not the ChannelKind named {name!r}")
            _kinds[name] = loaded
        return _kinds[name]


def target(destination: Destination) -> str:
    """Where ``destination`` delivers, in its channel's words, from its settings as they are; the
    channel's name when they do not say (settings written into the database by hand, which the
    channel then refuses to send to)."""
    try:
        kind = get(destination.channel)
    except UnknownChannel:
        return destination.channel
    if kind.target is None:
        return destination.channel
    try:
        return kind.target(destination.settings)
    except (LookupError, TypeError, ValueError):
        return destination.channel


def signing_secrets(destination: Destination) -> tuple[str, ...]:
    """The secrets of ``destination`` that sign what it is sent, as its channel tells them from its
    credentials (every one, for a channel that is not installed: it has no credentials to say)."""
    try:
        kind = get(destination.channel)
    except UnknownChannel:
        return destination.secrets
    return kind.signing(destination.secrets)


def register(kind: ChannelKind) -> None:
    """Install a channel that no distribution declares (an application's own, or a test's);
    it replaces one of the same name."""
    with _lock:
        _kinds[kind.name] = kind
