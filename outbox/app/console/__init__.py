"""The operator console at ``/console``: server-rendered pages, no script and no front-end build.
``router`` is what the app includes, ``Guard`` what it wraps itself in; the pages are in
``pages`` (and ``events``), the forms they send in ``actions`` and ``signin``, who may see and
send them in ``access``, who is signed in in ``sessions``, what every answer under ``/console`` carries in
``guard``. All their HTML is in ``templates/`` (``templates``: autoescaped), drawn from the records
the pages hand them and the words of ``formats`` and ``links``; their stylesheet and frame are in
``layout``, the charts' measures in ``charts``, the last hour's figures in ``health``, search
filters in ``filters`` and bulk replays' progress in ``replays``."""

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from ...outbox import Outbox
from . import actions, events, pages, signin
from .access import Access
from .guard import Guard
from .replays import Replays
from .sessions import COOKIE, LOGIN_COOKIE, csrf_for


def router(box: Callable[[Request], Outbox], authorize: Callable[[Request], Any]) -> APIRouter:
    """The console's routes, reading the outbox and the replay authority from the app."""
    console = APIRouter(prefix="/console", include_in_schema=False)
    access, replays = Access(box), Replays()
    events.register(console, access.box, access.signed_in)
    signin.register(console, access)
    pages.register(console, access, replays)
    actions.register(console, access, authorize, replays)
    return console


__all__ = ["COOKIE", "LOGIN_COOKIE", "Guard", "csrf_for", "router"]
