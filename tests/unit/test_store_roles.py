"""The store protocol is the roles its callers have (``outbox.store.protocol``): each method of
``Store`` is declared by exactly one role, and the conformance suite's list of methods it must
call (``recording.protocol_methods``, which REQUIRED is made of) reads them through the roles."""

from __future__ import annotations

from outbox.store import protocol
from outbox.store.protocol import Store

from ..conformance.recording import protocol_methods

ROLES = (protocol.Schema, protocol.Producing, protocol.Reading, protocol.Delivery, protocol.Operations,
         protocol.Registry)


def test_the_roles_partition_the_stores_methods_and_the_conformance_suite_requires_them_all():
    declared = [set(vars(role)) & protocol_methods(role) for role in ROLES]
    assert all(declared)
    assert sum(len(names) for names in declared) == len(set().union(*declared))  # none in two roles
    assert set().union(*declared) == protocol_methods(Store)
    assert {"apply", "insert_intent", "history", "put_destination", "migrate", "prune"} <= protocol_methods(Store)
    assert set(Store.__bases__) >= set(ROLES)
