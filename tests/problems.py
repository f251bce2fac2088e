"""The check every test of an error answer makes: an RFC 9457 problem (``application/problem+json``)
of the expected status and type, with a title, and a detail that says ``words``. It reads an httpx
response or a WSGI test client's (werkzeug) alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

PROBLEM_TYPE = "urn:outbox:problem:"


class Answer(Protocol):
    """What the check reads of a response."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...  # names looked up case-insensitively

    @property
    def text(self) -> str: ...


def assert_problem(response: Answer, status: int, kind: str, words: str = "") -> dict[str, Any]:
    """Assert that ``response`` is the problem ``kind`` with ``status`` whose detail contains
    ``words``; return its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = json.loads(response.text)
    assert body["type"] == PROBLEM_TYPE + kind and body["status"] == status, body
    assert body["title"] and body["detail"], body
    assert words in body["detail"], body["detail"]
    return body
