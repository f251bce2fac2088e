"""The ids' rules as pydantic types, and a destination's subscriptions: what the records'
specs (destinations, grants, tokens) and the API's shapes (``outbox.shapes``) are both built
from, so that the records need nothing of the API's layer.

An id's rule is a type (``ActionId``, ``Scope``, ...): it checks the value whole, as
``outbox.ids.check`` does, and documents the same rule as an anchored ECMA-262 ``pattern``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from .errors import InvalidInput
from .ids import ACTION_ID, DESTINATION_ID, ORDERING_KEY, SCOPE, TOKEN_ID, TOKEN_LABEL, check
from .topics import EVENT_ID, MAX_SUBSCRIPTIONS, PATTERN, TOPIC, checked_pattern, checked_topic

#: The longest a rotated secret still signs beside the new one (every window: the setting, a
#: destination's, a rotation's).
MAX_ROTATION_SECONDS = 30 * 86_400


def ecma(*alternatives: re.Pattern[str] | str) -> str:
    """Python patterns used with ``re.fullmatch`` (or literal strings) as one JSON Schema
    ``pattern`` (ECMA-262, which searches): anchored at both ends, where ``$`` allows no
    trailing newline."""
    cores = [re.escape(a) if isinstance(a, str) else a.pattern.removeprefix("^").removesuffix("$")
             for a in alternatives]
    return f"^(?:{'|'.join(cores)})$"


def _checked(pattern: re.Pattern[str], what: str, *literals: str) -> AfterValidator:
    """A validator refusing a value ``pattern`` does not match whole (unless it is one of
    ``literals``) with ``ids.check``'s words."""

    def checked(value: str) -> str:
        if value in literals:
            return value
        try:
            return check(pattern, value, what)
        except InvalidInput as exc:
            raise PydanticCustomError("malformed", "{reason}", {"reason": exc.message}) from None

    return AfterValidator(checked)


def _ruled(rule: Callable[[str], str]) -> AfterValidator:
    """A validator refusing what ``rule`` refuses (InvalidInput), in its words."""

    def checked(value: str) -> str:
        try:
            return rule(value)
        except InvalidInput as exc:
            raise PydanticCustomError("malformed", "{reason}", {"reason": exc.message}) from None

    return AfterValidator(checked)


def _documented(pattern: re.Pattern[str], *literals: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "pattern": ecma(*literals, pattern)})


ActionId = Annotated[str, _checked(ACTION_ID, "action_id"), _documented(ACTION_ID)]
Scope = Annotated[str, _checked(SCOPE, "scope"), _documented(SCOPE)]
#: A field naming a destination; ``DestinationId`` is the one in a path.
DestinationName = Annotated[str, _checked(DESTINATION_ID, "destination"), _documented(DESTINATION_ID)]
DestinationId = Annotated[str, _checked(DESTINATION_ID, "destination id"), _documented(DESTINATION_ID)]
GrantId = Annotated[str, _checked(DESTINATION_ID, "grant id"), _documented(DESTINATION_ID)]
#: What a grant reaches: a destination, or ``*`` for every one.
GrantTarget = Annotated[str, _checked(DESTINATION_ID, "destination", "*"), _documented(DESTINATION_ID, "*")]
OrderingKey = Annotated[str, _checked(ORDERING_KEY, "ordering_key"), _documented(ORDERING_KEY)]
TokenId = Annotated[str, _checked(TOKEN_ID, "token id"), _documented(TOKEN_ID)]
#: A scope a producer token may act in, or ``*`` for all.
TokenScope = Annotated[str, _checked(SCOPE, "scope", "*"), _documented(SCOPE, "*")]
TokenLabel = Annotated[str, _checked(TOKEN_LABEL, "label"), _documented(TOKEN_LABEL)]
#: An event's topic, and what a destination subscribes with (``outbox.topics``).
Topic = Annotated[str, _ruled(checked_topic), _documented(TOPIC)]
TopicPattern = Annotated[str, _ruled(checked_pattern), _documented(PATTERN)]
EventId = Annotated[str, _checked(EVENT_ID, "event_id"), _documented(EVENT_ID)]


class Subscription(BaseModel):
    """A destination's subscription: the events of the topics ``topic`` matches, in ``scopes``."""

    model_config = ConfigDict(extra="forbid")

    topic: TopicPattern = Field(description="a topic (invoice.paid), a prefix and .* (invoice.*: every topic under "
                                            "it), or * (every topic)")
    scopes: list[Scope] | None = Field(default=None, min_length=1, max_length=100, description=(
        "only these scopes' events; null: every scope that holds a grant for the destination"))


#: A destination's subscriptions, as registering it takes them.
Subscriptions = Annotated[list[Subscription], Field(max_length=MAX_SUBSCRIPTIONS)]
