"""The console's HTML templates (``templates/``), and the tenant portal's (``portal/templates/``,
named ``portal/...``), rendered with autoescape on: every value a template is given is text, so
a template cannot forget to escape what a producer, an operator, a receiver or a link wrote. All
the HTML is in the templates; the Python of a page hands them records and words
(``formats``' filters, ``links``' addresses), never markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, PrefixLoader, StrictUndefined

from ...lifecycle import Status
from . import formats, links

#: The portal's templates (by path: loading its package from here would import it halfway through the console's).
PORTAL = Path(__file__).parent.parent / "portal" / "templates"
ENV = Environment(loader=ChoiceLoader([PackageLoader(__package__),
                                      PrefixLoader({"portal": FileSystemLoader(PORTAL)})]),
                  autoescape=True, undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True)
ENV.filters.update(ago=formats.ago, exact=formats.exact, pretty=formats.pretty, text=formats.text,
                   indented=formats.indented)
ENV.globals.update(intent_url=links.intent_url, destination_url=links.destination_url, event_url=links.event_url,
                   Status=Status)  # (a status named by the lifecycle's enum, never spelt again in a template)


def render(name: str, **values: Any) -> str:
    """Template ``name`` filled with ``values`` (a name it uses and is not given fails)."""
    return ENV.get_template(name).render(**values)
