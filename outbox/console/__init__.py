"""The operator console at ``/console``: server-rendered pages, no script and no front-end build.
``router`` is what the app includes; the pages are in ``pages``, their look in ``layout``, the
charts in ``charts``, the last hour's figures in ``health``."""

from .pages import COOKIE, csrf_for, router

__all__ = ["COOKIE", "csrf_for", "router"]
