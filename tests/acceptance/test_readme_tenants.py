"""The README's tenants walkthroughs run as printed against ``outbox serve`` in a directory of their
own: a tenant token registers its own endpoint (its id and secret made by the outbox), an event of
its scope reaches it with no grant, the tenant lists its own intent, and rotates the secret; and
portal links minted with curl and with the CLI open the portal once. Only the port is this run's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from .test_readme import bash, shell_block_after
from .test_service import Service

HEADING = "## Tenants"


def test_the_tenants_walkthrough_registers_an_endpoint_of_its_own_and_reads_its_deliveries(tmp_path: Path):
    service = Service(tmp_path, "--no-worker")
    try:
        admin = service.first_admin_token()
        shown = bash(shell_block_after(HEADING).replace("localhost:8080", f"127.0.0.1:{service.port}"),
                     tmp_path).splitlines()
        seen = httpx.get(f"{service.url}/v1/destinations", headers={"Authorization": f"Bearer {admin}"}).json()
    finally:
        service.stop()
    made = json.loads((tmp_path / "made.json").read_text())
    assert made["id"].startswith("t-") and made["owner"] == "acme" and made["signing_secrets"] == 1
    assert shown[0] == f"secret (shown once): {made['secret']}"
    published, listed, rotated = (json.loads(line) for line in shown[1:4])
    assert [d["destination"] for d in published["fanout"]] == [made["id"]]
    assert [(i["destination"], i["status"]) for i in listed["items"]] == [(made["id"], "pending")]
    assert rotated["id"] == made["id"] and rotated["signing_secrets"] == 2
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != made["secret"]
    assert rotated["previous_secrets_until"] is not None
    assert [(d["id"], d["owner"]) for d in seen["items"]] == [(made["id"], "acme")]


def test_the_portal_walkthrough_mints_links_that_open_the_portal_once(tmp_path: Path):
    """The tenant portal's walkthrough as printed: a link minted over HTTP opens the endpoints page
    once, and one the CLI mints read-only shows a form to sign out and no other."""
    service = Service(tmp_path, "--no-worker")
    try:
        shown = bash(shell_block_after("### The tenant portal").replace("localhost:8080", f"127.0.0.1:{service.port}"),
                     tmp_path).splitlines()
    finally:
        service.stop()
    minted = json.loads((tmp_path / "link.json").read_text())
    assert minted["scope"] == "acme" and minted["session_seconds"] == 1800 and minted["url"].startswith("/portal/open")
    assert shown == [f"303 http://127.0.0.1:{service.port}/portal", "<h1>Endpoints</h1>", "403",
                     "action='/portal/logout'"]
    assert "outbox_portal" in (tmp_path / "browser.txt").read_text()
