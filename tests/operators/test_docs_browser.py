"""/docs in a real headless Chromium: Swagger UI renders every operation of /openapi.json and
the page asks nothing of any host but the service (it works without the network)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx

from outbox import Settings
from outbox.app.api import create_app

from ..servers import Served
from .test_console_browser import chromium


def test_docs_render_every_operation_without_another_host(tmp_path: Path):
    served = Served(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'docs.db'}", worker=False)))
    try:
        with chromium() as browser:
            context = browser.new_context()
            elsewhere: list[str] = []

            def route(request_route) -> None:  # every request, answered only if it is ours
                url = request_route.request.url
                if urlsplit(url).netloc == urlsplit(served.url).netloc:
                    request_route.continue_()
                else:
                    elsewhere.append(url)
                    request_route.abort()

            context.route("**/*", route)
            page = context.new_page()
            page.set_default_timeout(15_000)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(served.url + "/docs")
            page.wait_for_selector(".opblock")
            operations = page.locator(".opblock-summary-path").all_inner_texts()
            assert "/v1/intents/{action_id}/replay" in [o.replace("\u200b", "") for o in operations]
            documented = httpx.get(served.url + "/openapi.json").json()["paths"]
            assert len(operations) == sum(len(methods) for methods in documented.values())  # every one drawn
            page.locator(".opblock-summary", has_text="/v1/replay").first.click()
            body = page.locator(".opblock-body").first
            assert "dry_run" in body.inner_text()  # the request body's example
            assert "urn:outbox:problem:" in body.inner_text()  # the problem answers
            page.screenshot(path=str(tmp_path / "docs.png"), full_page=True)
    finally:
        served.stop()
    assert elsewhere == [] and errors == []
    assert (tmp_path / "docs.png").stat().st_size > 10_000
