"""Signing in to the console as a browser does: the sign-in page first, whose form carries the
value of its own cookie, then the form; and the CSRF value of the session it opened."""

from __future__ import annotations

import re

import httpx

from outbox.app.console import COOKIE, csrf_for

#: The hidden field of a console form.
FIELD = re.compile(r"name='csrf' value='([^']+)'")


def form_value(html: str) -> str:
    """The CSRF value a page's first form carries."""
    found = FIELD.search(html)
    assert found is not None, html
    return found.group(1)


def sign_in(http: httpx.Client, token: str, **headers: str) -> httpx.Response:
    """Sign ``http`` in with ``token`` through the sign-in page (its cookies kept by the client)."""
    value = form_value(http.get("/console/login").text)
    return http.post("/console/login", data={"token": token, "csrf": value}, headers=headers)


async def signed_in(http: httpx.AsyncClient, token: str) -> httpx.Response:
    """``sign_in`` for an async client."""
    value = form_value((await http.get("/console/login")).text)
    return await http.post("/console/login", data={"token": token, "csrf": value})


def csrf(http: httpx.Client | httpx.AsyncClient) -> str:
    """The CSRF value of the session ``http`` holds."""
    return csrf_for(http.cookies[COOKIE])
