"""The operator console at ``/console``: server-rendered pages, no script and no front-end build.
``router`` is what the app includes; the pages are in ``pages``, their look in ``layout``, the
charts in ``charts``, the last hour's figures in ``health``, search filters in ``filters`` and
bulk replays' progress in ``replays``."""

from .pages import COOKIE, csrf_for, router

__all__ = ["COOKIE", "csrf_for", "router"]
