"""The documented import path of the service (``outbox.app.service``): ``create_service``, the
API composed with the sender as ``outbox serve`` runs it, and ``listening``, what it gives uvicorn."""

from .app.service import create_service, listening

__all__ = ["create_service", "listening"]
