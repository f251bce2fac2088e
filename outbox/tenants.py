"""Tenants: a scope that manages its own destinations (``Destination.owner``) with a token of
role ``tenant``.

A tenant is untrusted: what its own destination may be is decided here, from the settings an
admin gives (``tenant_channels``, ``tenant_private_networks``, ``tenant_max_destinations``,
``tenant_max_subscriptions``), before anything is written. Its destination's ids are made by the
outbox, so that no id a tenant picks can meet, and so reveal, another scope's.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import NotForTenants, TenantLimit

if TYPE_CHECKING:
    from .destinations import Destination, DestinationSpec
    from .settings import Settings

#: What every id of a tenant's own destination starts with (the rest is random).
ID_PREFIX = "t-"


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """The most destinations one tenant owns, and subscriptions they hold in all."""

    destinations: int
    subscriptions: int

    @classmethod
    def of(cls, settings: Settings) -> TenantLimits:
        return cls(settings.tenant_max_destinations, settings.tenant_max_subscriptions)


def new_destination_id() -> str:
    """A fresh id for a tenant's destination (64 random bits, in ``ids.DESTINATION_ID``'s form)."""
    return ID_PREFIX + secrets.token_hex(8)


def owned_spec(spec: DestinationSpec, owner: str, settings: Settings) -> DestinationSpec:
    """``spec`` as ``owner``'s own destination keeps it: its subscriptions for the owner alone.
    Raises NotForTenants for a channel, a private network or an approval an admin decides, and
    for a subscription naming other scopes."""
    if spec.channel not in settings.tenant_channels:
        allowed = ", ".join(settings.tenant_channels) or "(none)"
        raise NotForTenants(f"a tenant's destination may use the channels {allowed}, not {spec.channel!r}")
    if spec.allow_private_network and owner not in settings.tenant_private_networks:
        raise NotForTenants("allow_private_network is not allowed for this tenant: its destinations reach public "
                            "addresses only (an admin allows a tenant with the setting tenant_private_networks)")
    if spec.requires_approval:
        raise NotForTenants("requires_approval holds intents for an operator's approval; an admin sets it")
    if any(s.scopes is not None and set(s.scopes) != {owner} for s in spec.subscriptions):
        raise NotForTenants("a tenant's destination receives its own scope's events only: give its subscriptions "
                            "no scopes")
    subscriptions = [s.model_copy(update={"scopes": [owner]}) for s in spec.subscriptions]
    return spec.model_copy(update={"subscriptions": subscriptions})


def as_allowed(destination: Destination, settings: Settings) -> Destination:
    """``destination`` as the sender may reach it now: a tenant's own reaches private networks
    only while its owner is in ``tenant_private_networks``, so an admin who takes a tenant out of
    it shuts its registered private destinations out at the next send (the SSRF guard refuses
    them, ``not_submitted``), not only its next registration."""
    if (destination.owner is None or not destination.allow_private_network
            or destination.owner in settings.tenant_private_networks):
        return destination
    return dataclasses.replace(destination, allow_private_network=False)


def decide_limits(limits: TenantLimits, *, others: int, others_subscriptions: int, subscriptions: int) -> None:
    """Whether a tenant that owns ``others`` destinations besides this one, holding
    ``others_subscriptions`` subscriptions, may hold this one with ``subscriptions``. Raises
    TenantLimit."""
    if others + 1 > limits.destinations:
        raise TenantLimit(f"this tenant owns {others} destinations, the most it may (tenant_max_destinations); "
                          "delete one first", limit=limits.destinations)
    if others_subscriptions + subscriptions > limits.subscriptions:
        raise TenantLimit(f"this tenant's destinations would hold {others_subscriptions + subscriptions} "
                          f"subscriptions, more than the {limits.subscriptions} it may (tenant_max_subscriptions)",
                          limit=limits.subscriptions)
