"""``outbox serve``'s log after hostile requests, as a terminal or a log pipeline reads it: each
line is one record the service wrote, whatever a request carried (newlines, terminal escapes, C1
controls, line separators, kilobytes), in text and in JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from ..conftest import SECRET
from .test_service import Service, cli

pytestmark = pytest.mark.acceptance

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: What a producer may try to write into the log: a forged record on a line of its own, terminal
#: escapes (clear the screen, colour), a carriage return, a line separator.
FORGED = "CRITICAL outbox.sender: dead: rejected action_id=forged"
HOSTILE = f"x\n{FORGED}\r\x1b[2J\x1b[31mred\u2028tail"
#: What no line of the log holds as it is (the newline that ends each line aside).
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
#: A record's first line: a level and a logger.
RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
#: Longer than any line a request may now make (a value is cut at 1,000 characters).
LONGEST_LINE = 3000


def hostile_requests(svc: Service, admin: str) -> dict[str, httpx.Response]:
    """A batch whose items carry a tracestate of about 8 KB holding HOSTILE (half of them refused,
    to an unknown destination), an enqueue whose tracestate header holds C1 controls, and a
    request for a path of 20,000 characters; their answers."""
    auth = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=svc.url, headers=auth, timeout=30) as c:
        assert c.put("/v1/destinations/hook", json={"url": "https://hook.example/", "secret": SECRET}).is_success
        state = f"a=b,{HOSTILE}," + "," * 8000
        items = [{"action_id": f"b{n}", "scope": "acme", "destination": "hook" if n % 2 else "nope",
                  "payload": {"n": n}, "traceparent": PARENT, "tracestate": state} for n in range(20)]
        return {
            "batch": c.post("/v1/intents:batch", json={"intents": items}),
            "header": c.post("/v1/intents", json={"action_id": "h1", "scope": "acme", "destination": "hook",
                                                  "payload": {}},
                             headers={"traceparent": PARENT, "tracestate": b"a=b,x\x85\x9b2J\x9b31my"}),
            "path": c.get("/v1/intents/" + "p" * 20_000),
            "stored": c.get("/v1/intents/b1"),
        }


def served_log(workdir: Path, log_format: str) -> tuple[list[str], dict[str, httpx.Response]]:
    """The lines ``outbox serve --no-worker`` logged in ``log_format`` around the hostile
    requests, and their answers."""
    cli(workdir, "migrate")  # only serve, worker and migrate make the database
    admin = json.loads(cli(workdir, "--json", "tokens", "create", "--role", "admin").stdout)["token"]
    svc = Service(workdir, "--no-worker", env={"OUTBOX_LOG_FORMAT": log_format})
    try:
        answers = hostile_requests(svc, admin)
    finally:
        svc.stop()
    return svc.log.read_text(encoding="utf-8", errors="backslashreplace").splitlines(), answers


def check_answers(answers: dict[str, httpx.Response]) -> None:
    """The requests were answered as ever: the malformed tracestate dropped, the traceparent kept."""
    assert [r["status"] for r in answers["batch"].json()["results"]] == [422, 201] * 10
    assert answers["header"].status_code == 201
    assert answers["path"].status_code == 422  # (an action id that long is not one)
    assert answers["stored"].json()["trace"] == {"traceparent": PARENT}


def test_text_lines_are_each_one_record_whatever_a_request_carried(tmp_path: Path):
    lines, answers = served_log(tmp_path, "text")
    check_answers(answers)
    assert any(line.startswith("INFO uvicorn.access: ") and "POST /v1/intents:batch" in line for line in lines)
    for line in lines:
        assert RECORD.match(line) or line.startswith("  "), line[:200]  # a record, or a traceback's line
        assert not line.startswith("CRITICAL"), line[:200]  # nothing here logs one but a forgery
        assert not CONTROLS.search(line), line[:200]
        assert len(line) < LONGEST_LINE, line[:200]
    (long_path,) = [line for line in lines if "/v1/intents/ppp" in line]
    assert "... (" in long_path and " more characters)" in long_path


def test_json_lines_stay_one_object_each_and_are_cut_as_text_lines(tmp_path: Path):
    lines, answers = served_log(tmp_path, "json")
    check_answers(answers)
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert {"uvicorn.access", "uvicorn.error", "outbox.api"} <= {r["logger"] for r in records}
    for line in lines:
        assert not CONTROLS.search(line) and len(line) < LONGEST_LINE, line[:200]
    assert not any(FORGED in r["message"] for r in records)  # the malformed tracestate was never quoted
    (long_path,) = [r for r in records if "/v1/intents/ppp" in r["message"]]
    assert " more characters)" in long_path["message"]
