"""How every console page looks: the frame, status pills, human times, pretty replies, links.

Nothing here runs script: the pages are plain HTML under a policy that forbids it (``web.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse
from markupsafe import Markup

from .templates import ENV, render

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:10px 16px;display:flex;flex-wrap:wrap;gap:16px;align-items:center}
header a{color:#fff} main{padding:16px;max-width:1400px;box-sizing:border-box}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%;background:#fff;margin:8px 0 20px} table.compact{width:auto;min-width:16em}
td pre{margin:0;font-size:12px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#eaeef2;overflow-wrap:normal}
.pill{padding:1px 8px;border-radius:10px;background:#ddf4ff;white-space:nowrap}
.dead,.revoked,.paused,.disabled,.open{background:#ffebe9} .unknown,.held,.probing{background:#fff8c5}
.delivered,.closed{background:#dafbe1}
form.inline{display:inline-block;margin:4px 8px 4px 0;padding:6px;border:1px solid #d0d7de;background:#fff}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-end;background:#fff;padding:8px;
border:1px solid #d0d7de} form.filters label{display:flex;flex-direction:column;font-size:12px}
.flash{padding:8px;background:#dafbe1;border:1px solid #4ac26b} .error{background:#ffebe9;border-color:#ff8182}
.calm{color:#1a7f37} .warning{padding:8px;background:#fff8c5;border:2px solid #d4a72c;font-size:15px}
code{font-size:12px} header form{margin:0} time{border-bottom:1px dotted #57606a;white-space:nowrap}
pre{background:#fff;border:1px solid #d0d7de;padding:8px;overflow-x:auto;max-width:100%;white-space:pre-wrap;
overflow-wrap:anywhere;box-sizing:border-box}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(320px,100%),1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #d0d7de;padding:8px} figcaption{font-size:12px;color:#57606a}
svg{width:100%;height:auto} .num{text-align:right;white-space:nowrap}
main>p,h1{overflow-wrap:anywhere} input,select{max-width:100%} form.inline{max-width:100%;box-sizing:border-box}
tr.more td{border-top:none;background:#fbfcfd} tr.more td>b{font-size:12px;color:#57606a}
details>summary{cursor:pointer;color:#0969da;font-size:12px}
details.id{display:inline-block;vertical-align:top} details.id>summary{white-space:nowrap}
.k{color:#57606a;font-size:12px}
ul.headline{list-style:none;padding:0;margin:8px 0 16px;display:flex;flex-wrap:wrap;gap:8px}
ul.headline li{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:6px 12px}
ul.headline li.bad{border:2px solid #cf222e} ul.headline li.warn{border:2px solid #d4a72c}
ul.headline b{font-size:20px;margin-right:4px} ul.headline .quiet{color:#57606a}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;background:#fff;border:1px solid #d0d7de;
padding:8px;margin:8px 0 20px} dl.fields dt{font-weight:600} dl.fields dd{margin:0;overflow-wrap:anywhere}
@media (max-width:700px){
main{padding:8px} table.stack,table.stack tbody,table.stack tr,table.stack td{display:block}
table.stack thead{display:none} table.stack tr{border:1px solid #d0d7de;margin-bottom:8px}
table.stack td{border:none;border-top:1px solid #eaeef2;text-align:left;overflow-wrap:anywhere}
table.stack tr.more{margin-top:-9px;border-top:none}
table.stack td:empty{display:none}
table.stack td[data-label]::before{content:attr(data-label);display:inline-block;min-width:7.5em;font-weight:600;
color:#57606a;margin-right:8px}
dl.fields{grid-template-columns:1fr} dl.fields dd{margin-bottom:6px}
}
"""

#: The pieces every page draws, as macros of ``templates/parts.html`` (each escapes what it is given as text).
PARTS: Any = ENV.get_template("parts.html").module
#: The console's sections, as the header links to them.
NAV = (("Overview", "/console"), ("Intents", "/console/intents"), ("Events", "/console/events"),
       ("Destinations", "/console/destinations"), ("Bulk replay", "/console/replay"))


def page(title: str, body: str, *, csrf: str | None = None, status: int = 200,
         refresh: int | None = None) -> HTMLResponse:
    """A console page (``templates/page.html``) around ``body``, HTML its page built from escaped
    parts; ``refresh`` reloads it every that many seconds (a progress view, no script). A
    signed-in operator's (``csrf``: the session's CSRF value) has the sections and a sign-out
    button in its header; anyone else's, neither."""
    return HTMLResponse(render("page.html", title=title, body=Markup(body), csrf=csrf, refresh=refresh, nav=NAV),
                        status_code=status)


#: A table row: its cells' HTML, and optionally what goes under it across the whole width.
Row = tuple[Sequence[str], str] | Sequence[str]


def table(head: list[str], rows: Sequence[Row], empty: str = "none", *, numeric: tuple[str, ...] = (),
          compact: bool = False) -> str:
    """A table of rows of cells. It fits the page's width (long values wrap); on a narrow screen
    each row stacks into a card whose cells are labelled with their column, so nothing needs
    scrolling sideways. A row given with a second part draws that under it across the width
    (an attempt's error and reply). Columns named in ``numeric`` align right; a ``compact`` table
    (a few narrow columns) is as wide as its content and never stacks."""
    drawn = []
    for row in rows:
        values, more = row if isinstance(row, tuple) else (row, "")
        drawn.append(([(h, h in numeric, Markup(v)) for h, v in zip(head, values, strict=True)], Markup(more)))
    return str(PARTS.table(head, drawn, empty, "compact" if compact else "stack"))


def short_id(value: str, keep: int = 8) -> str:
    """A long id cut to its last ``keep`` characters (uuid7s share their first ones), the whole
    of it on hover and in a ``<details>`` for a phone; a short one whole."""
    return str(PARTS.short_id(value, keep))


def fields(values: dict[str, Any]) -> str:
    """A record's fields as a definition list, whatever they are: a value that is not a string
    shows as JSON, a missing one as —."""
    def shown(value: Any) -> str:
        if value is None:
            return "—"
        return escape(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))

    listed = "".join(f"<dt>{escape(k)}</dt><dd>{shown(v)}</dd>" for k, v in values.items())
    return f"<dl class='fields'>{listed}</dl>"


def flashes(done: str = "", error: str = "") -> str:
    return (f"<p class='flash'>{escape(done)}</p>" if done else "") + (
        f"<p class='flash error'>{escape(error)}</p>" if error else "")


def pill(value: str) -> str:
    return str(PARTS.pill(value))


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
    return str(PARTS.time(at.isoformat(), exact.strip(), text))


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
    return str(PARTS.link(intent_url(action_id, scope), action_id))


def destination_url(destination_id: str) -> str:
    return f"/console/destinations/{quote(destination_id, safe='')}"


def destination_link(destination_id: str) -> str:
    """A destination's name, linking to its page."""
    return str(PARTS.link(destination_url(destination_id), destination_id))
