"""The operator console at ``/console``: server-rendered pages, no script and no front-end build.
``router`` is what the app includes, ``Guard`` what it wraps itself in; the pages are in
``pages``, who is signed in in ``sessions``, what every answer under ``/console`` carries in
``guard``, their look in ``layout``, the charts in ``charts``, the last hour's figures in
``health``, search filters in ``filters`` and bulk replays' progress in ``replays``."""

from .guard import Guard
from .pages import router
from .sessions import COOKIE, LOGIN_COOKIE, csrf_for

__all__ = ["COOKIE", "LOGIN_COOKIE", "Guard", "csrf_for", "router"]
