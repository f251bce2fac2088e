"""The console's HTML templates (``templates/``), rendered with autoescape on: every value is
text unless it is ``Markup`` (HTML a part of the console built), so a template cannot forget to
escape what a producer, an operator or a link wrote."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

ENV = Environment(loader=PackageLoader(__package__), autoescape=True, undefined=StrictUndefined,
                  trim_blocks=True, lstrip_blocks=True)


def render(name: str, **values: Any) -> Markup:
    """Template ``name`` filled with ``values`` (a name it uses and is not given fails)."""
    return Markup(ENV.get_template(name).render(**values))
