"""The library on real SQLite files: enqueue, transactions with the caller's SQL, registries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from outbox import (
    DestinationSpec,
    IntentConflict,
    IntentQuery,
    InvalidInput,
    ManualClock,
    NotFound,
    Outbox,
    PayloadTooLarge,
    Role,
    Settings,
    Status,
)
from outbox.grants import GrantSpec

from ..conftest import SECRET, snapshot


async def test_enqueue_records_a_pending_intent_with_a_generated_uuid7(box: Outbox):
    result = await box.enqueue(destination="billing", scope="acme", payload={"invoice": 42})
    assert result.created
    intent = await box.get(result.intent.action_id)
    assert intent.status is Status.PENDING
    assert intent.action_id[14] == "7"  # UUIDv7
    assert intent.payload_digest.startswith("sha256:")


async def test_reordered_payload_keys_are_the_same_operation(box: Outbox):
    first = await box.enqueue(destination="billing", scope="acme", action_id="op-1",
                              payload={"a": 1, "b": [1, 2]})
    again = await box.enqueue(destination="billing", scope="acme", action_id="op-1",
                              payload={"b": [1, 2], "a": 1})
    assert not again.created and again.intent.seq == first.intent.seq
    with pytest.raises(IntentConflict):
        await box.enqueue(destination="billing", scope="acme", action_id="op-1",
                          payload={"a": 1, "b": [1, 2], "c": None})


async def test_bad_input_is_refused_before_anything_is_written(db_path, box: Outbox):
    before = snapshot(db_path)
    cases = [
        (dict(action_id="has space"), InvalidInput, "action_id"),
        (dict(scope=""), InvalidInput, "scope"),
        (dict(destination="Bad!"), InvalidInput, "destination"),
        (dict(payload={"n": 2**64}), InvalidInput, "I-JSON"),
        (dict(not_before=datetime(2030, 1, 1)), InvalidInput, "timezone"),
        (dict(expires_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))), InvalidInput,
         "expires_at: .* outside the times"),
        (dict(not_before=datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(-timedelta(hours=1)))), InvalidInput,
         "not_before: .* outside the times"),
        (dict(not_before=0), InvalidInput, "not_before: 0 is not a time"),
        (dict(max_attempts=0), InvalidInput, "max_attempts"),
        (dict(max_attempts=True), InvalidInput, "max_attempts must be an integer"),
        (dict(max_attempts=5.0), InvalidInput, "max_attempts must be an integer"),
        (dict(payload={"\udfff": 1}), InvalidInput, "lone surrogate"),
        (dict(action_id="nl-1\n"), InvalidInput, "action_id"),
        (dict(scope="acme\n"), InvalidInput, "scope"),
        (dict(scope="s" * 60, action_id="a" * 200), InvalidInput, "at most 255"),
        (dict(payload=json.loads("[" * 65 + "]" * 65)),
         InvalidInput, "deeper than 64"),
    ]
    for override, error, words in cases:
        intent = dict(destination="billing", scope="acme", payload={"ok": 1}) | override
        with pytest.raises(error, match=words):
            await box.enqueue(**intent)
    assert snapshot(db_path) == before


async def test_payloads_over_the_limit_are_refused(db_path, db_url):
    async with await Outbox.open(db_url, settings=Settings(max_payload_bytes=100)) as small:
        await small.put_destination("billing", DestinationSpec(url="https://b.example/", secret=SECRET))
        before = snapshot(db_path)
        with pytest.raises(PayloadTooLarge, match="limit is 100"):
            await small.enqueue(destination="billing", scope="acme", payload={"x": "y" * 100})
        assert snapshot(db_path) == before


async def test_not_before_schedules_the_first_attempt(db_url):
    clock = ManualClock()
    async with await Outbox.open(db_url, clock=clock) as box:
        await box.put_destination("billing", DestinationSpec(url="https://b.example/", secret=SECRET))
        later = clock.now() + timedelta(hours=2)
        result = await box.enqueue(destination="billing", scope="acme", payload={}, not_before=later)
        assert result.intent.next_attempt_at == later
        assert result.intent.created_at == clock.now()


async def test_every_time_a_caller_gives_the_library_is_held_to_the_apis_rule(box: Outbox):
    """The batch calls, a grant's expiry and a listing's filters, as ``enqueue`` (above)."""
    early = datetime(1, 1, 1, tzinfo=timezone(timedelta(minutes=1)))
    good = dict(destination="billing", scope="acme", payload={})
    with pytest.raises(InvalidInput, match="expires_at: .* outside the times"):
        await box.enqueue_many([good, {**good, "expires_at": early}])
    [refused, taken] = await box.enqueue_each([{**good, "not_before": early}, {**good, "action_id": "ok"}])
    assert isinstance(refused, InvalidInput) and "not_before: " in refused.message
    with pytest.raises(ValidationError, match="outside the times"):
        GrantSpec(scope="acme", destination="billing", expires_at=early)
    for name in ("created_after", "created_before"):
        with pytest.raises(InvalidInput, match=f"{name}: .* outside the times"):
            await box.list_intents(IntentQuery(**{name: early}))
    assert taken.intent.action_id == "ok"  # (and the whole of enqueue_many was refused)
    assert [i.action_id for i in (await box.list_intents(IntentQuery())).intents] == ["ok"]


async def test_enqueue_many_is_all_or_nothing(box: Outbox):
    await box.enqueue(destination="billing", scope="acme", action_id="taken", payload={"v": 1})
    with pytest.raises(IntentConflict):
        await box.enqueue_many([
            dict(destination="billing", scope="acme", action_id="new-1", payload={}),
            dict(destination="billing", scope="acme", action_id="taken", payload={"v": 2}),
        ])
    with pytest.raises(NotFound):
        await box.get("new-1")
    done = await box.enqueue_many(
        dict(destination="billing", scope="acme", payload={"i": i}) for i in range(100))
    assert len(done) == 100 and all(r.created for r in done)


async def test_business_row_and_intent_commit_together(box: Outbox):
    async with box.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    async with box.transaction() as tx:
        await tx.execute("INSERT INTO orders VALUES (?, ?)", (1, 990))
        result = await tx.enqueue(destination="billing", scope="acme", action_id="order-1",
                                  payload={"order": 1, "total": 990})
    assert result.created
    assert (await box.get("order-1")).status is Status.PENDING
    async with box.transaction() as tx:
        assert await tx.execute("SELECT total FROM orders") == [(990,)]


async def test_business_row_and_intent_roll_back_together(box: Outbox):
    async with box.transaction() as tx:
        await tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    with pytest.raises(RuntimeError, match="card declined"):
        async with box.transaction() as tx:
            await tx.execute("INSERT INTO orders VALUES (?, ?)", (1, 990))
            await tx.enqueue(destination="billing", scope="acme", action_id="order-1", payload={})
            raise RuntimeError("card declined")
    with pytest.raises(NotFound):
        await box.get("order-1")
    async with box.transaction() as tx:
        assert await tx.execute("SELECT count(*) FROM orders") == [(0,)]


async def test_destination_secrets_rotate_and_are_kept_on_update(box: Outbox):
    from sender.webhook import new_secret

    spec = DestinationSpec(url="https://b.example/v2")
    updated, created = await box.put_destination("billing", spec)
    assert not created and updated.secrets == (SECRET,)
    rotated = new_secret()
    updated, _ = await box.put_destination("billing", spec.model_copy(update={"secret": rotated}))
    assert updated.secrets == (rotated, SECRET)
    with pytest.raises(InvalidInput, match="needs a whsec_ secret"):
        await box.put_destination("crm", DestinationSpec(url="https://crm.example/"))


async def test_tokens_authenticate_until_revoked(box: Outbox):
    token, info = await box.create_token(Role.PRODUCER, ["acme"], label="shop")
    assert (await box.authenticate(token)) == info
    assert await box.authenticate(token + "x") is None
    await box.revoke_token(info.id)
    assert await box.authenticate(token) is None
    with pytest.raises(InvalidInput, match="at least one scope"):
        await box.create_token(Role.PRODUCER)
    with pytest.raises(InvalidInput, match="every scope"):
        await box.create_token(Role.OPERATOR, ["acme"])


async def test_time_is_stored_as_utc_to_the_microsecond(db_url):
    start = datetime(2031, 5, 6, 7, 8, 9, 987654, tzinfo=UTC)
    async with await Outbox.open(db_url, clock=ManualClock(start)) as box:
        await box.put_destination("billing", DestinationSpec(url="https://b.example/", secret=SECRET))
        result = await box.enqueue(destination="billing", scope="acme", payload={})
        assert (await box.get(result.intent.action_id)).created_at == start
