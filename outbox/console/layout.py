"""How every console page looks: the frame, status pills, human times, pretty replies, links.

Nothing here runs script: the pages are plain HTML under a policy that forbids it (``web.py``)."""

from __future__ import annotations

import json
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:10px 16px;display:flex;flex-wrap:wrap;gap:16px;align-items:center}
header a{color:#fff} main{padding:16px;max-width:1400px}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:max-content;min-width:100%;background:#fff;margin:8px 0 20px}
td pre{margin:0;max-width:36em;font-size:12px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top;max-width:32em}
th{background:#eaeef2} .pill{padding:1px 8px;border-radius:10px;background:#ddf4ff;white-space:nowrap}
.dead,.revoked,.paused{background:#ffebe9} .unknown,.held{background:#fff8c5} .delivered,.closed{background:#dafbe1}
form.inline{display:inline-block;margin:4px 8px 4px 0;padding:6px;border:1px solid #d0d7de;background:#fff}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-end;background:#fff;padding:8px;
border:1px solid #d0d7de} form.filters label{display:flex;flex-direction:column;font-size:12px}
.flash{padding:8px;background:#dafbe1;border:1px solid #4ac26b} .error{background:#ffebe9;border-color:#ff8182}
code{font-size:12px} header form{margin:0} time{border-bottom:1px dotted #57606a}
pre{background:#fff;border:1px solid #d0d7de;padding:8px;overflow-x:auto;max-width:100%;white-space:pre-wrap}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #d0d7de;padding:8px} figcaption{font-size:12px;color:#57606a}
svg{width:100%;height:auto} .num{text-align:right}
main>p,h1{overflow-wrap:anywhere} input,select{max-width:100%} form.inline{max-width:100%;box-sizing:border-box}
"""


def page(title: str, body: str, *, signed_in: bool = True, status: int = 200,
         refresh: int | None = None) -> HTMLResponse:
    """A console page; ``refresh`` reloads it every that many seconds (a progress view, no script)."""
    nav = ('<a href="/console">Overview</a><a href="/console/intents">Intents</a>'
           '<a href="/console/events">Events</a>'
           '<a href="/console/replay">Bulk replay</a><form method="post" action="/console/logout">'
           '<button>Sign out</button></form>') if signed_in else ""
    meta = f"<meta http-equiv='refresh' content='{refresh}'>" if refresh else ""
    return HTMLResponse(
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>{meta}"
        f"<title>{escape(title)} · outbox</title><link rel='stylesheet' href='/console/style.css'></head>"
        f"<body><header><strong>outbox console</strong>{nav}</header>"
        f"<main><h1>{escape(title)}</h1>{body}</main></body></html>",
        status_code=status,
    )


def table(head: list[str], rows: list[str], empty: str = "none") -> str:
    """A table (scrolling sideways on a narrow screen) of rendered ``<tr>`` rows."""
    cells = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(rows) or f"<tr><td colspan={len(head)}>{escape(empty)}</td></tr>"
    return f"<div class='scroll'><table><tr>{cells}</tr>{body}</table></div>"


def flashes(done: str = "", error: str = "") -> str:
    return (f"<p class='flash'>{escape(done)}</p>" if done else "") + (
        f"<p class='flash error'>{escape(error)}</p>" if error else "")


def pill(value: str) -> str:
    return f"<span class='pill {escape(value)}'>{escape(value)}</span>"


def when(at: datetime | None, now: datetime) -> str:
    """``at`` relative to ``now`` ("3 min ago", "in 20 s"), the exact time on hover."""
    if at is None:
        return "—"
    seconds = (now - at).total_seconds()
    ago = abs(seconds)
    if ago < 5:
        text = "just now"
    else:
        amount = (f"{ago:.0f} s" if ago < 60 else f"{ago // 60:.0f} min" if ago < 3600
                  else f"{ago // 3600:.0f} h" if ago < 2 * 86_400 else f"{ago // 86_400:.0f} days")
        text = f"{amount} ago" if seconds > 0 else f"in {amount}"
    exact = at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " " + (at.tzname() or "")
    return f"<time datetime='{escape(at.isoformat())}' title='{escape(exact.strip())}'>{text}</time>"


def pretty(text: str | None) -> str:
    """A stored reply as a ``<pre>``: JSON indented, and JSON held in a string (a webhook reply's
    ``body``) unwrapped, so nothing shows escaped twice; anything else as it came. Escaped once."""
    if not text:
        return ""
    try:
        value = _unwrapped(json.loads(text))
    except ValueError:
        return f"<pre>{escape(text)}</pre>"
    return f"<pre>{escape(json.dumps(value, indent=2, ensure_ascii=False))}</pre>"


def _unwrapped(value: Any, depth: int = 0) -> Any:
    """``value`` with strings that hold a JSON object or array decoded (two levels deep)."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "[") and depth < 2:
        try:
            return _unwrapped(json.loads(value), depth + 1)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: _unwrapped(v, depth) for k, v in value.items()}
    return value


def intent_url(action_id: str, scope: str | None, action: str = "", **query: str) -> str:
    """An intent's console page (or one of its actions), naming its scope: action ids are unique
    per scope only."""
    path = f"/console/intents/{quote(action_id, safe='')}" + (f"/{action}" if action else "")
    params = ({"scope": scope} if scope else {}) | query
    return path + ("?" + urlencode(params) if params else "")


def intent_link(action_id: str, scope: str) -> str:
    return f"<a href='{escape(intent_url(action_id, scope))}'>{escape(action_id)}</a>"
