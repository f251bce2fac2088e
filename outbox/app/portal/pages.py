"""The tenant portal's pages and forms: its endpoints with their last hour, the deliveries search,
one delivery's attempts, and the forms that add, edit, rotate, test and replay. Every page is of
the session's one scope, through the tenant routes' functions and presenters
(``routes.tenant``), so it shows what the tenant API would answer and nothing more."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ... import channels, operations
from ...destinations import Destination as DestinationRecord
from ...errors import OutboxError
from ...events import EventQuery
from ...model import Status
from ...portal import PortalSession
from ...shapes import destination_json
from ...store import IntentQuery
from ..console.destination import circuit_state
from ..console.health import health, window
from ..console.layout import STYLE
from ..problems import Problem, from_error
from ..routes.operators import authorize
from ..routes.tenant import (
    TENANT_REPLAYABLE,
    _spec,
    enqueue_test,
    owned_ids,
    register_own,
    replace_own,
    replay_dead_or_unknown,
    tenant_history,
    tenant_intent,
)
from . import access
from .access import box, page

#: The most deliveries a search shows.
PAGE = 50
#: The most characters of a reply's body shown.
REPLY_SHOWN = 4096
STATUSES = [s.value for s in Status]

Form = dict[str, list[str]]


def sent(fields: Form, name: str) -> str:
    return fields.get(name, [""])[-1].strip()


def topics_of(text: str) -> list[dict[str, str]]:
    """A form's topics (comma- or space-separated) as subscriptions; each is checked as the API's are."""
    return [{"topic": topic} for topic in text.replace(",", " ").split()]


def endpoint_body(request: Request, scope: str, fields: Form) -> dict[str, Any]:
    """What an endpoint form says, as the tenant API's destination body: reaching private
    networks where an admin allowed the tenant that (``tenant_private_networks``)."""
    return {"url": sent(fields, "url"), "subscriptions": topics_of(sent(fields, "topics")),
            "idempotent": sent(fields, "idempotent") == "on", "disabled": sent(fields, "disabled") == "on",
            "allow_private_network": scope in box(request).settings.tenant_private_networks}


def edited_body(request: Request, scope: str, held: DestinationRecord, fields: Form) -> dict[str, Any]:
    """What an edit form says over what the endpoint holds: the fields the form shows as sent,
    every other (timeouts, retries, limits, ordering, ...) as it was; private networks still only
    while the tenant is allowed them."""
    takes = channels.get(held.channel).spec.model_fields
    kept = {name: value for name, value in destination_json(held).items() if name in takes}
    shown = endpoint_body(request, scope, fields)
    return {**kept, **shown, "allow_private_network": kept["allow_private_network"] and shown["allow_private_network"]}


def refused(request: Request) -> HTMLResponse:
    return page(request, "portal/message.html", "Not signed in", None, status=401,
                message="Open the portal from your application again: this page needs a portal session, "
                        "and it has ended or was never opened here.")


def stale(request: Request, opened: PortalSession) -> HTMLResponse:
    """A form without this session's CSRF value, refused."""
    return page(request, "portal/message.html", "Refused", opened, status=403,
                message="The form was stale or not sent from this portal: reload it and send it again.")


def failed(request: Request, title: str, opened: PortalSession, exc: OutboxError | Problem) -> HTMLResponse:
    """What the outbox refused, on a page of the status the API would answer."""
    problem = exc if isinstance(exc, Problem) else from_error(exc)
    return page(request, "portal/message.html", title, opened, status=problem.status, message=problem.detail)


def register(router: APIRouter) -> None:
    """Add the portal's pages and forms to ``router`` (prefix ``/portal``)."""

    @router.get("/style.css")
    async def style(request: Request) -> Response:
        colour = box(request).settings.portal_colour
        return Response(STYLE + f"header{{background:{colour}}} header img{{max-height:28px}}\n",
                        media_type="text/css")

    @router.get("/open")
    async def open_link(request: Request, link: str = "") -> Response:
        """Open a link once: its session's cookie, and on to the endpoints."""
        opened = await box(request).open_portal_link(link) if link else None
        if opened is None:
            return page(request, "portal/message.html", "Link expired", None, status=403,
                        message="This portal link has expired or was used already. Open the portal from your "
                                "application again for a new one.")
        session_id, session = opened
        response = RedirectResponse("/portal", status_code=303)
        access.open_session(response, request, session_id, session)
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        """End the session, if the form is its own (another site cannot sign a user out), and drop
        its cookie; without a session there is nothing to end."""
        opened = await access.session(request)
        if opened is not None:
            if access.forged(request, await access.form(request)):
                return stale(request, opened)
            await box(request).close_portal_session(request.cookies[access.COOKIE])
        response = page(request, "portal/signed_out.html", "Signed out", None)
        access.end_session(response, request)
        return response

    def viewed(view: Callable[[Request, PortalSession], Awaitable[Response]]
               ) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            opened = await access.session(request)
            return refused(request) if opened is None else await view(request, opened)
        return guarded

    def acted(title: str, act: Callable[[Request, PortalSession, Form], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """A form's route: a session that may write, this session's CSRF value, and an error the
        outbox raises shown on a page of its own (400, 404 or 409 as the API answers)."""
        async def guarded(request: Request) -> Response:
            opened = await access.session(request)
            if opened is None:
                return refused(request)
            if opened.read_only:
                return page(request, "portal/message.html", "Read-only", opened, status=403,
                            message="This portal session may look but change nothing.")
            fields = await access.form(request)
            if access.forged(request, fields):
                return stale(request, opened)
            try:
                return await act(request, opened, fields)
            except (OutboxError, Problem) as exc:
                return failed(request, title, opened, exc)
        return guarded

    async def endpoints(request: Request, opened: PortalSession) -> Response:
        outbox = box(request)
        now = outbox.clock.now()
        owned = await outbox.list_destinations(owner=opened.scope)
        healths = {h.destination: h for h in health(await outbox.store.activity(window(now)[0], now),
                                                    [d.id for d in owned])}
        rows = [{"destination": destination_json(d), "state": circuit_state(request, d, now)[0],
                 "health": healths[d.id]} for d in owned]
        return page(request, "portal/endpoints.html", "Endpoints", opened, endpoints=rows, now=now)

    async def endpoint(request: Request, opened: PortalSession) -> Response:
        destination_id = request.path_params["destination_id"]
        try:
            found = await box(request).get_destination(destination_id, owner=opened.scope)
        except OutboxError as exc:
            return failed(request, "Endpoint", opened, exc)
        shown = destination_json(found)
        topics = " ".join(s["topic"] for s in shown.get("subscriptions", []))
        return page(request, "portal/endpoint.html", "Endpoint", opened, endpoint=shown, topics=topics,
                    state=circuit_state(request, found, box(request).clock.now())[0])

    async def create(request: Request, opened: PortalSession, fields: Form) -> Response:
        spec = _spec(endpoint_body(request, opened.scope, fields))
        made, secret = await register_own(box(request), opened.scope, spec, f"portal:{opened.scope}")
        return page(request, "portal/secret.html", "Endpoint added", opened, endpoint=destination_json(made),
                    secret=secret)

    async def edit(request: Request, opened: PortalSession, fields: Form) -> Response:
        destination_id = request.path_params["destination_id"]
        held = await box(request).get_destination(destination_id, owner=opened.scope)
        spec = _spec(edited_body(request, opened.scope, held, fields))
        await replace_own(box(request), opened.scope, destination_id, spec, f"portal:{opened.scope}")
        return RedirectResponse(f"/portal/endpoints/{destination_id}", status_code=303)

    async def rotate(request: Request, opened: PortalSession, fields: Form) -> Response:
        rotated, secret = await box(request).rotate_secret(request.path_params["destination_id"],
                                                           owner=opened.scope)
        return page(request, "portal/secret.html", "Secret rotated", opened, endpoint=destination_json(rotated),
                    secret=secret)

    async def test(request: Request, opened: PortalSession, fields: Form) -> Response:
        made = await enqueue_test(box(request), opened.scope, request.path_params["destination_id"],
                                  f"portal:{opened.scope}")
        return RedirectResponse(f"/portal/deliveries/{made.action_id}", status_code=303)

    async def replay(request: Request, opened: PortalSession, fields: Form) -> Response:
        action_id = request.path_params["action_id"]
        await replay_dead_or_unknown(box(request), authorize(request), opened.scope, action_id,
                                     operations.Actor(f"portal:{opened.scope}", "replayed from the tenant portal"),
                                     sent(fields, "accept_duplicate_risk") == "on")
        return RedirectResponse(f"/portal/deliveries/{action_id}", status_code=303)

    async def deliveries(request: Request, opened: PortalSession) -> Response:
        outbox, query = box(request), request.query_params
        chosen = {"status": query.get("status", ""), "topic": query.get("topic", ""),
                  "after": query.get("after", ""), "before": query.get("before", "")}
        try:
            after, before = (_time(chosen[k]) for k in ("after", "before"))
            status = [Status(chosen["status"])] if chosen["status"] else None
            own = await owned_ids(request, opened.scope)
            if chosen["topic"]:  # the deliveries of the events of that topic
                events = await outbox.list_events(EventQuery(scopes=[opened.scope], topic=chosen["topic"],
                                                             created_after=after, created_before=before, limit=PAGE))
                wanted = {s.value for s in status} if status else None
                found: list[dict[str, Any]] = [
                    {"action_id": d.action_id, "destination": d.destination, "status": d.status.value,
                     "topic": e.topic, "created_at": e.created_at}
                    for e in events.events for d in e.fanout
                    if d.status is not None and (wanted is None or d.status.value in wanted)]
            else:
                page_ = await outbox.list_intents(IntentQuery(statuses=status, scopes=[opened.scope],
                                                              created_after=after, created_before=before, limit=PAGE))
                found = [{**tenant_intent(i, i.destination in own), "topic": None, "created_at": i.created_at}
                         for i in page_.intents]
        except (OutboxError, ValueError) as exc:
            return page(request, "portal/deliveries.html", "Deliveries", opened, status=400, chosen=chosen,
                        statuses=STATUSES, found=[], error=str(getattr(exc, "message", exc)))
        return page(request, "portal/deliveries.html", "Deliveries", opened, chosen=chosen, statuses=STATUSES,
                    found=found, error="")

    async def delivery(request: Request, opened: PortalSession) -> Response:
        outbox, action_id = box(request), request.path_params["action_id"]
        try:
            intent, history = await outbox.show(action_id, scope=opened.scope)
        except OutboxError as exc:
            return failed(request, "Delivery", opened, exc)
        own = intent.destination in await owned_ids(request, opened.scope)
        shown, told = tenant_intent(intent, own), tenant_history(history, own)
        attempts = [{**a, "sent": _request_headers(intent.key, a) if intent.channel == "webhook"
                     else {}, "answer": _reply(a["reply"])} for a in told["attempts"]]
        return page(request, "portal/delivery.html", "Delivery", opened, intent=shown, attempts=attempts,
                    replayable=intent.status in TENANT_REPLAYABLE)

    for path, view in (("", endpoints), ("/endpoints/{destination_id}", endpoint), ("/deliveries", deliveries),
                       ("/deliveries/{action_id}", delivery)):
        router.add_api_route(path, viewed(view), methods=["GET"], name=f"portal_{view.__name__}")
    for path, title, act in (("/endpoints", "Add an endpoint", create), ("/endpoints/{destination_id}", "Edit", edit),
                             ("/endpoints/{destination_id}/rotate", "Rotate", rotate),
                             ("/endpoints/{destination_id}/test", "Test", test),
                             ("/deliveries/{action_id}/replay", "Replay", replay)):
        router.add_api_route(path, acted(title, act), methods=["POST"], name=f"portal_{act.__name__}")


def _time(text: str) -> datetime | None:
    """A search's time (ISO 8601 with an offset), or None when not given."""
    if not text:
        return None
    at = datetime.fromisoformat(text)
    if at.tzinfo is None:
        raise ValueError(f"{text!r} needs its offset (2030-01-01T12:00:00+00:00)")
    return at


def _request_headers(key: str, attempt: dict[str, Any]) -> dict[str, str]:
    """The headers the webhook channel sent that the attempt's record determines (the signature
    and its timestamp are made at send time and not kept)."""
    return {"Content-Type": "application/json", "Idempotency-Key": key, "webhook-id": key,
            "Outbox-Attempt-Id": attempt["attempt_id"], "Outbox-Fence": str(attempt["fence"])}


def _reply(reply: str | None) -> dict[str, Any] | None:
    """A webhook attempt's stored reply as its headers and body (bounded); another channel's as its text."""
    if not reply:
        return None
    try:
        found = json.loads(reply)
    except ValueError:
        return {"headers": {}, "body": reply[:REPLY_SHOWN]}
    if isinstance(found, dict) and isinstance(found.get("headers"), dict):
        return {"headers": {str(k): str(v) for k, v in found["headers"].items()},
                "body": str(found.get("body", ""))[:REPLY_SHOWN]}
    return {"headers": {}, "body": reply[:REPLY_SHOWN]}
