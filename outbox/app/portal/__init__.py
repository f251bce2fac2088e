"""The tenant portal at ``/portal``: server-rendered pages a tenant's user opens from your
application by a single-use link (``outbox.portal``), acting in that one scope. ``router`` is
what the app includes, ``Guard`` what it wraps itself in; the pages and forms are in ``pages``,
who is in and what every answer carries in ``access``. No script runs on any page."""

from fastapi import APIRouter

from . import pages
from .access import COOKIE, Guard


def router() -> APIRouter:
    """The portal's routes."""
    portal = APIRouter(prefix="/portal", include_in_schema=False)
    pages.register(portal)
    return portal


__all__ = ["COOKIE", "Guard", "router"]
