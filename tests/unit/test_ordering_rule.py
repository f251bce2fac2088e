"""The ordering rule (what is in the way of a key's later intent) is written once per dialect,
``in_the_way``, with lifecycle's statuses: every statement that asks it (the claims, the
flow-limited claim's function, waiting_behind) holds that one text."""

from __future__ import annotations

import re

from outbox.lifecycle import OPEN, STOPPED
from outbox.store.postgres.sql import SQL as POSTGRES
from outbox.store.sqlite.sql import SQL as SQLITE

ASKED = re.compile(r"earlier\.status IN \(([^)]*)\)")


def test_every_statement_asking_whats_in_a_keys_way_holds_the_one_rule_with_lifecycles_statuses():
    for sql, askers in ((POSTGRES, {"cycle", "next_due_at", "claim_limited_function", "waiting_behind"}),
                        (SQLITE, {"due_seqs", "next_due_at", "flow_due_seqs", "unlimited_due_seqs",
                                  "waiting_behind"})):
        found = {name for name, text in sql.items() if ASKED.search(text)} - {"in_the_way", "claimable"}
        assert found == askers
        for name in found:
            listed = ASKED.search(sql[name])[1]  # type: ignore[index]
            assert {s.strip(" '") for s in listed.split(",")} == {s.value for s in OPEN | STOPPED}, name
            assert "ordering_on_dead = 'block'" in sql[name]
