"""Schemathesis hooks for test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS)."""

from typing import Any

import schemathesis

#: The longest a generated long poll (``?wait=``) may wait: the runs are bounded in time.
MAX_WAIT = 0.2


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
    """Shorten a valid long poll; invalid ``wait`` values are sent as generated."""
    if not isinstance(case.query, dict) or "wait" not in case.query:
        return
    try:
        wait = float(case.query["wait"])
    except (TypeError, ValueError):
        return
    if MAX_WAIT < wait <= 60:
        case.query["wait"] = MAX_WAIT
