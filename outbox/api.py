"""The documented import path of the HTTP API (``outbox.app.api``): ``create_app`` and
``begin_shutdown``."""

from .app.api import begin_shutdown, create_app

__all__ = ["begin_shutdown", "create_app"]
