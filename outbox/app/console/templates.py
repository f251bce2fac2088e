"""The console's HTML templates (``templates/``), and the tenant portal's (``portal/templates/``,
named ``portal/...``), rendered with autoescape on: every value is
text unless it is ``Markup`` (HTML a part of the console built), so a template cannot forget to
escape what a producer, an operator or a link wrote. Parts the Python of a page still builds
(``layout``'s tables, pills, times) are handed in as ``Markup``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, PrefixLoader, StrictUndefined

#: The portal's templates (by path: loading its package from here would import it halfway through the console's).
PORTAL = Path(__file__).parent.parent / "portal" / "templates"
ENV = Environment(loader=ChoiceLoader([PackageLoader(__package__),
                                      PrefixLoader({"portal": FileSystemLoader(PORTAL)})]),
                  autoescape=True, undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True)


def render(name: str, **values: Any) -> str:
    """Template ``name`` filled with ``values`` (a name it uses and is not given fails). A part
    built elsewhere is given as ``Markup``; the answer is plain ``str``, so that a page joining it
    with other HTML does not escape that (``Markup + str`` would)."""
    return ENV.get_template(name).render(**values)
