"""How every console page looks: its stylesheet, and the answer of a page drawn in its frame.

Nothing here runs script: the pages are plain HTML under a policy that forbids it (``web.py``)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import HTMLResponse

from .templates import render

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


def page(template: str, title: str, *, csrf: str | None = None, status: int = 200, refresh: int | None = None,
         **values: Any) -> HTMLResponse:
    """A console page: ``template`` (which extends ``templates/page.html``) filled with ``values``;
    ``refresh`` reloads it every that many seconds (a progress view, no script). A signed-in
    operator's (``csrf``: the session's CSRF value) has the sections and a sign-out button in its
    header; anyone else's, neither."""
    return HTMLResponse(render(template, title=title, csrf=csrf, refresh=refresh, **values), status_code=status)
