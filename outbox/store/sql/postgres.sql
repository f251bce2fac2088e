-- The PostgreSQL dialect. Each statement is a named block: "-- name: NAME" then a one-line purpose.
-- {placeholders} in braces are filled from fixed fragments in Python, never from user input.
-- A statement that makes an intent pending (an enqueue, a replay, a retry) calls
-- pg_notify('outbox_due', ''): it reaches every listening process when its transaction commits,
-- and never if it rolls back. Every statement that reads intents as records reads, beside each one's columns,
-- {event_payload[row]} (filled from the block event_payload for the intents row it names): an intent of an event sends
-- the payload stored once in the event's row (payload_event names it, migration 0018) and keeps none of its own; any
-- other its own. An intent is read as a record from the view intent_records (migration 0023): its row with its lease,
-- if one is held (intent_leases), as every reader shows it; a statement that reads intents itself reads its stored
-- status, in which a leased intent is 'pending', and looks for its lease row where the difference matters.

-- name: event_payload
-- The payload stored once for the event the intents row {of} sends it for (payload_event); NULL: it has its own.
CASE WHEN {of}.payload_event IS NOT NULL
     THEN (SELECT shared.payload FROM topic_events AS shared WHERE shared.seq = {of}.payload_event) END

-- name: held_group
-- One group of the events an attempt keeps (outbox/store/timeline.py): [after, entries], after being the id of the
-- last events row of intent {seq} (0: none), entries the JSON text {entries}. Filled in where attempts are written.
jsonb_build_array(jsonb_build_array(
    coalesce((SELECT max(logged.id) FROM events AS logged WHERE logged.intent_seq = {seq}), 0), {entries}::jsonb))

-- name: unrecorded_lease
-- Whether intent_leases row {of}, as the statement found it, is a lease whose "leased" fact is recorded nowhere yet:
-- neither in an attempt started under its fence (whose row keeps it) nor as a "leased" row (one written before 0019).
-- The claim writes none; the move that starts its attempt or ends the lease records it. Filled in where a statement
-- names it with the row in brackets.
(NOT EXISTS (SELECT 1 FROM attempts AS under WHERE under.intent_seq = {of}.intent_seq AND under.fence = {of}.fence)
 AND NOT EXISTS (SELECT 1 FROM events AS fact WHERE fact.intent_seq = {of}.intent_seq AND fact.kind = 'leased'
                                                AND fact.data @> jsonb_build_object('fence', {of}.fence)))

-- name: lease_entry
-- The "leased" fact of intent_leases row {of} (its claim set leased_at, lease_owner and fence) as an entry of a group
-- an attempt keeps (outbox/store/timeline.py). Filled in where a statement names it with the row in brackets.
jsonb_build_array('leased', to_char({of}.leased_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                  {of}.lease_owner, NULL, jsonb_build_object('fence', {of}.fence))

-- name: holds_no_lease
-- Whether intents row {of} holds no lease: one probe of a hash of the leases held (few: those in flight), built once
-- per statement, for each row as an index gives it (NOT IN stays a filter, where NOT EXISTS would become a join whose
-- estimate, with a table's statistics behind its rows, can read and sort every due row before a claim's limit).
({of}.seq NOT IN (SELECT held_by.intent_seq FROM intent_leases AS held_by))

-- name: unleased
-- The lease columns of a record (intent_records) for an intents row that holds no lease: where a move's statement
-- returns the row it wrote (one that starts from a status no lease is held in) as a record.
NULL::text AS lease_owner, NULL::timestamptz AS lease_expires_at

-- name: leased_record
-- Intents row {of} as a record (intent_records' columns, in its order) under the lease intent_leases row {lease} that
-- this statement inserted (which a read of the view in it cannot see yet).
{of}.seq, {of}.intent_key, {of}.scope, {of}.destination, {of}.channel, {of}.payload, {of}.payload_digest,
'leased'::text AS status, {of}.attempts, {of}.max_attempts, {of}.next_attempt_at, {of}.not_before, {of}.expires_at,
{lease}.lease_owner, {lease}.lease_expires_at, {lease}.fence, {of}.created_at, {lease}.leased_at AS updated_at,
{of}.last_error, {of}.approved_digest, {of}.approval_expires_at, {of}.approved_by, {of}.action_id, {of}.ordering_key,
{of}.event_id, {of}.replayed_after, {of}.trace_context, {of}.payload_event, {of}.status AS stored_status

-- name: function_body
-- The body of a function of the store's (by its signature) as the database holds it, or null: there is none.
SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1);

-- name: relation_exists
-- A table or view of the store's by name (null: the migrations have not made it).
SELECT to_regclass($1);

-- name: lock_migrations
-- One migrator at a time, across processes and hosts, until the migration's transaction ends (the key is "outbox" in ASCII).
SELECT pg_advisory_xact_lock(122511947133816);

-- name: create_migrations_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL
);

-- name: applied_migrations
-- Versions already applied.
SELECT version FROM schema_migrations ORDER BY version;

-- name: record_migration
-- Mark a migration applied, in the same transaction as its statements.
INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3);

-- name: ping
-- Prove the database answers.
SELECT 1;

-- name: clock
-- The database's time, read as late as the statement runs (not when its transaction began).
SELECT clock_timestamp();

-- name: destination_for_enqueue
-- What an enqueue needs to know about its destination, read inside the enqueue's transaction (an owned one is
-- reached by its owner's intents only: outbox.store.intake.judged).
SELECT channel, requires_approval, owner FROM destinations WHERE id = $1;

-- name: lock_ordering_keys
-- Enqueues of one destination and ordering key (arrays $1, $2) take turns until their transactions end, so a key's
-- seq order is its commit order and a claim never sees a later intent of a key while an earlier one is yet to commit.
-- A destination's keys share 256 locks (a batch of any size holds few), taken in one order (batches never deadlock).
SELECT count(pg_advisory_xact_lock(held.destination, held.bucket)) FROM (
    SELECT DISTINCT hashtext(d) AS destination, hashtext(k) & 255 AS bucket
    FROM unnest($1::text[], $2::text[]) AS u (d, k) ORDER BY 1, 2
) AS held;

-- name: insert_intent
-- Create an intent with its first event unless its key (scope/action_id) exists, while its destination $4 still says
-- what the intent was judged on (a destination_for_enqueue row, read in this transaction or an earlier one): its
-- channel $5 and requires_approval $23 ($22: the event whose stored payload it sends, if any); returns the new seq,
-- or nothing (the key exists, or the destination says otherwise now). The event's data is bound as text, then cast: on an application's connection a JSON codec
-- (asyncpg's set_type_codec with json.dumps) would encode a jsonb parameter's text once more, storing a JSON string.
WITH created AS (
    INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                         max_attempts, next_attempt_at, not_before, expires_at, created_at, updated_at, ordering_key,
                         event_id, trace_context, payload_event)
    SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, $8::text, $9::integer,
           $10::timestamptz, $11::timestamptz, $12::timestamptz, $13::timestamptz, $13::timestamptz, $19::text,
           $20::text, $21::text, $22::bigint
    FROM destinations WHERE id = $4 AND channel = $5 AND requires_approval = $23::boolean
    ON CONFLICT (intent_key) DO NOTHING
    RETURNING seq, status
), logged AS (
    INSERT INTO events (intent_seq, kind, at, actor, reason, data)
    SELECT seq, $14::text, $15::timestamptz, $16::text, $17::text, $18::text::jsonb FROM created
)
SELECT seq, CASE WHEN status = 'pending' THEN pg_notify('outbox_due', '') END AS notified FROM created;

-- name: insert_intents
-- Create the intents of a batch (one row per key, as arrays $1-$22), each with its first event, skipping keys that
-- exist; returns each new intent's key and seq. Inserted in the batch's order, so seq order is that order.
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                         $8::text[], $9::integer[], $10::timestamptz[], $11::timestamptz[], $12::timestamptz[],
                         $13::timestamptz[], $14::text[], $15::timestamptz[], $16::text[], $17::text[], $18::text[],
                         $19::text[], $20::text[], $21::text[], $22::bigint[])
        WITH ORDINALITY AS u (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                              max_attempts, next_attempt_at, not_before, expires_at, created_at, kind, at, actor, reason,
                              data, ordering_key, event_id, trace_context, payload_event, n)
), created AS (
    INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                         max_attempts, next_attempt_at, not_before, expires_at, created_at, updated_at, ordering_key,
                         event_id, trace_context, payload_event)
    SELECT intent_key, action_id, scope, destination, channel, payload, payload_digest, status, max_attempts,
           next_attempt_at, not_before, expires_at, created_at, created_at, ordering_key, event_id, trace_context,
           payload_event
    FROM batch ORDER BY n
    ON CONFLICT (intent_key) DO NOTHING
    RETURNING seq, intent_key, status
), logged AS (
    INSERT INTO events (intent_seq, kind, at, actor, reason, data)
    SELECT created.seq, batch.kind, batch.at, batch.actor, batch.reason, batch.data::jsonb
    FROM created JOIN batch USING (intent_key)
)
SELECT intent_key, seq, CASE WHEN status = 'pending' THEN pg_notify('outbox_due', '') END AS notified FROM created;

-- name: intents_by_keys
-- The intents holding any of the keys $1.
SELECT *, {event_payload[intents]} AS event_payload FROM intent_records AS intents WHERE intent_key = ANY($1::text[]);

-- name: intent_by_key
-- One intent by its key (scope/action_id).
SELECT *, {event_payload[intents]} AS event_payload FROM intent_records AS intents WHERE intent_key = $1;

-- name: intents_by_action
-- The intents of every scope that use an action id (at most one per scope).
SELECT *, {event_payload[intents]} AS event_payload FROM intent_records AS intents WHERE action_id = $1 ORDER BY scope;

-- name: attempts_of
-- An intent's attempts, first to last.
SELECT * FROM attempts WHERE intent_seq = $1 ORDER BY number;

-- name: lease_unrecorded
-- Whether intent $1 is leased under a lease whose "leased" fact is recorded nowhere yet (null: no lease): its
-- timeline reads it from the intent's record.
SELECT {unrecorded_lease[intent_leases]} FROM intent_leases WHERE intent_seq = $1;

-- name: events_of
-- The rows of an intent's history, oldest first (with what its attempts keep, its timeline: outbox/store/timeline.py).
SELECT id, kind, at, actor, reason, data FROM events WHERE intent_seq = $1 ORDER BY id;

-- name: in_the_way
-- An intent ("earlier") in the way of a later one ("due") of its destination ("ordered", whose ordering is 'key') and
-- its key: open, or stopped (dead, revoked) while the destination blocks on them. The statuses are lifecycle's OPEN and
-- STOPPED, filled in by outbox.store.plumbing.with_ordering_rule, which fills the rule into claimable, waiting_behind
-- and the flow-limited claim's function. It reads the stored status of intents row "earlier": a leased one is stored
-- 'pending', open like 'leased', so an in-flight earlier intent is in the way without a look at its lease.
earlier.destination = due.destination AND earlier.ordering_key = due.ordering_key AND earlier.seq < due.seq
  AND earlier.status IN ({open}, {stopped})
  AND (earlier.status NOT IN ({stopped}) OR ordered.ordering_on_dead = 'block')

-- name: claimable
-- Not in the way of its key: an intent (as "due") of a destination with ordering 'key' waits while an earlier one
-- is in the way (in_the_way); one seek of intents_ordering. Filled into the statements that pick due intents.
(due.ordering_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM destinations AS ordered, intents AS earlier
    WHERE ordered.id = due.destination AND ordered.ordering = 'key' AND {in_the_way}))

-- name: claim_limited_function
-- The flow-limited claim, outbox_claim_limited(claimer, claimed_at, lease_until, cap), which the cycle calls when some
-- destinations have a limit or a pause: for each, under a lock of its bucket row, it leases what its limits allow of
-- its due intents (claimable: the ordering rule the other claims use) and says what it held back (destination, held
-- paused, in flight and rate, the epoch second to look again). It computes with each stored limit as the nearest the
-- API takes (outbox.flow), a bucket's count between 0 and its burst, and a time no later than 9999-12-31T23:59:59Z,
-- so one destination's values never fail the claim. Like the other claims it writes no event and no intents row: a
-- lease is a row of intent_leases, recorded as a fact by its attempt's start, or by the move that ends it
-- (unrecorded_lease). Each of its statements reads a snapshot taken after the bucket's lock, so it sees the leases of
-- every claimer of the destination before it. The store creates it as migrations end (PostgresStore.migrate),
-- replacing an older body: migrations 0013 and 0016 made the earlier ones (0023 dropped them: they returned intents).
CREATE OR REPLACE FUNCTION outbox_claim_limited(claimer text, claimed_at timestamptz, lease_until timestamptz,
                                                cap integer)
RETURNS TABLE (flow_destination text, held_paused integer, held_in_flight integer, held_rate integer,
               flow_retry_at double precision, flow_leased intent_records[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    d destinations;
    bucket destination_buckets;
    v_left integer := cap;
    v_due integer;
    v_in_flight integer;
    v_tokens double precision;
    v_room integer;
    v_allowed integer;
    v_rate double precision;  -- the limits as computed with (null: none)
    v_burst integer;
    v_cap integer;
    v_elapsed double precision;
    v_horizon constant double precision := 253402300799;
    v_took bigint[];
BEGIN
    FOR d IN SELECT * FROM destinations AS f
             WHERE f.max_in_flight IS NOT NULL OR f.rate_per_second IS NOT NULL OR f.paused_until > claimed_at
             ORDER BY f.id
    LOOP
        EXIT WHEN v_left <= 0;
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM intents AS due
            WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                  AND {holds_no_lease[due]});
        flow_destination := d.id; held_paused := 0; held_in_flight := 0; held_rate := 0;
        flow_retry_at := NULL; flow_leased := ARRAY[]::intent_records[];
        IF d.paused_until > claimed_at THEN
            SELECT count(*) INTO v_due FROM (
                SELECT 1 FROM intents AS due
                WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                  AND {holds_no_lease[due]}
                LIMIT v_left) AS w;
            held_paused := v_due;
            flow_retry_at := least(extract(epoch FROM d.paused_until), v_horizon);  -- ('infinity': the horizon)
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- (greatest and least pass over a null: none stays none by the CASE)
        v_rate := CASE WHEN d.rate_per_second IS NULL THEN NULL WHEN d.rate_per_second = 'NaN' THEN 0.00001
                       ELSE least(greatest(d.rate_per_second, 0.00001), 100000) END;
        v_burst := least(greatest(coalesce(d.rate_burst, 1), 1), 100000);
        v_cap := CASE WHEN d.max_in_flight IS NULL THEN NULL ELSE least(greatest(d.max_in_flight, 1), 100000) END;
        INSERT INTO destination_buckets (destination, tokens, refilled_at)
        VALUES (d.id, CASE WHEN v_rate IS NULL THEN 0 ELSE v_burst END, claimed_at)
        ON CONFLICT (destination) DO NOTHING;
        SELECT * INTO bucket FROM destination_buckets AS k WHERE k.destination = d.id FOR UPDATE;
        v_room := v_left;  -- what max_in_flight leaves room for
        IF v_cap IS NOT NULL THEN
            SELECT count(*) INTO v_in_flight FROM (  -- (enough once it reaches the limit)
                SELECT 1 FROM intent_leases AS l WHERE l.destination = d.id
                LIMIT v_cap) AS l;
            v_room := greatest(0, least(v_left, v_cap - v_in_flight));
        END IF;
        v_allowed := v_room;  -- and of that, what the tokens allow
        IF v_rate IS NOT NULL THEN
            v_elapsed := CASE WHEN isfinite(bucket.refilled_at)
                                  THEN greatest(0, extract(epoch FROM claimed_at - bucket.refilled_at))
                              WHEN bucket.refilled_at > claimed_at THEN 0
                              ELSE 'Infinity' END;
            v_tokens := least(v_burst::double precision,
                              CASE WHEN bucket.tokens = 'NaN' THEN 0
                                   ELSE least(greatest(bucket.tokens, 0), v_burst) END + v_elapsed * v_rate);
            v_allowed := greatest(0, least(v_room, floor(v_tokens)::integer));
        END IF;
        IF v_allowed > 0 THEN
            WITH picked AS (
                SELECT seq, destination, fence FROM intents AS due
                WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                  AND {holds_no_lease[due]}
                  AND {claimable}
                ORDER BY due.next_attempt_at LIMIT v_allowed
                FOR UPDATE OF due SKIP LOCKED
            ), took AS (
                INSERT INTO intent_leases (intent_seq, destination, lease_owner, lease_expires_at, fence, leased_at)
                SELECT seq, destination, claimer, lease_until, fence + 1, claimed_at FROM picked
                ON CONFLICT (intent_seq) DO NOTHING
                RETURNING intent_seq
            )
            SELECT coalesce(array_agg(took.intent_seq), ARRAY[]::bigint[]) INTO v_took FROM took;
            SELECT coalesce(array_agg(r ORDER BY r.next_attempt_at), ARRAY[]::intent_records[]) INTO flow_leased
            FROM intent_records AS r WHERE r.seq = ANY(v_took);  -- (a statement of its own: it sees the leases)
        END IF;
        v_due := cardinality(flow_leased);
        IF v_due = v_allowed AND v_allowed < v_left THEN  -- a limit took less than the claim could: count the rest
            SELECT v_due + count(*) INTO v_due FROM (
                SELECT 1 FROM intents AS due
                WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                  AND {holds_no_lease[due]}
                LIMIT v_left - v_due) AS w;
        END IF;
        held_in_flight := greatest(0, v_due - v_room);
        held_rate := greatest(0, least(v_due, v_room) - cardinality(flow_leased));
        IF v_rate IS NOT NULL THEN
            v_tokens := v_tokens - cardinality(flow_leased);
            IF cardinality(flow_leased) > 0 THEN
                UPDATE destination_buckets SET tokens = v_tokens, refilled_at = greatest(refilled_at, claimed_at)
                WHERE destination = d.id;
            END IF;
            IF held_rate > 0 THEN  -- (1 - v_tokens) / v_rate is at most 100,000 s: clamped all the same
                flow_retry_at := least(extract(epoch FROM claimed_at) + (1 - v_tokens) / v_rate, v_horizon);
            END IF;
        END IF;
        v_left := v_left - cardinality(flow_leased);
        CONTINUE WHEN v_due = 0;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- name: waiting_behind
-- The earliest intent in the way of a pending intent (key $1, unleased) of an ordered destination, as the claim
-- judges it, as a record.
SELECT record.*, {event_payload[record]} AS event_payload FROM intent_records AS record WHERE record.seq = (
    SELECT earlier.seq FROM intents AS due
    JOIN destinations AS ordered ON ordered.id = due.destination AND ordered.ordering = 'key'
    JOIN intents AS earlier ON {in_the_way}
    WHERE due.intent_key = $1 AND due.status = 'pending'
      AND {holds_no_lease[due]}
    ORDER BY earlier.seq LIMIT 1);

-- name: renew_leases
-- Heartbeat: extend the leases (arrays of keys and fences) a worker still holds, each judged as the cycle judges a
-- lease at its fence; returns those renewed. Only the lease rows are written (HOT: their one index, the key, is
-- unchanged); the intents' rows are read to find them.
UPDATE intent_leases SET lease_expires_at = $1
FROM unnest($2::text[], $3::bigint[]) AS held (intent_key, fence) JOIN intents ON intents.intent_key = held.intent_key
WHERE intents.intent_key = ANY($2::text[]) AND {still_leased[intents, intent_leases, held.fence]}
RETURNING held.intent_key, held.fence;

-- name: expired_leases
-- Leases that ran out (the sweeper's work), each with the attempt started under its fence and not finished.
SELECT intents.*, {event_payload[intents]} AS event_payload,
       (SELECT started FROM attempts AS started  -- the whole row, as one value
        WHERE started.intent_seq = intents.seq AND started.fence = intents.fence AND started.finished_at IS NULL
        ORDER BY started.number DESC LIMIT 1) AS in_flight
FROM intent_leases AS lease JOIN intent_records AS intents ON intents.seq = lease.intent_seq
WHERE lease.lease_expires_at <= $1 ORDER BY lease.lease_expires_at LIMIT $2;

-- name: still_leased
-- Whether intents row {of} is still leased at fence {fence} by intent_leases row {lease}: the lease row exists, and the
-- intent's stored fence is the one below its lease's (a claim leases without writing the intent's row). The moves that
-- end or renew a lease (settle, start, release, hold, renew_leases) judge a worker's lease by it.
{lease}.intent_seq = {of}.seq AND {of}.fence = {fence} - 1

-- name: lease_running
-- Whether the lease of intent_leases row {of} still runs when an attempt starts at {at}: moves.lease_running's rule (a
-- test holds them to each other), which the cycle's start judges here, where it locks the intent's row.
{of}.lease_expires_at > {at}

-- name: limited
-- A destination (as "destinations") with a limit or a pause at a time: its intents are claimed by
-- outbox_claim_limited. Filled into the statements that claim or look for due intents, with the time.
(max_in_flight IS NOT NULL OR rate_per_second IS NOT NULL OR paused_until > {at})

-- name: next_due_at
-- When the soonest pending intent not waiting behind another of its key falls due; with a time $1, leaving out
-- those of limited or paused destinations due by then (a claim at $1 held them back, and says when to look again).
SELECT next_attempt_at FROM intents AS due WHERE status = 'pending' AND {claimable}
  AND {holds_no_lease[due]}
  AND ($1::timestamptz IS NULL OR next_attempt_at > $1
       OR due.destination <> ALL (ARRAY(SELECT id FROM destinations WHERE {limited})))
ORDER BY next_attempt_at LIMIT 1;

-- name: pause_destination
-- Send nothing to a destination until $2 (a receiver's Retry-After), unless it is paused longer already.
UPDATE destinations SET paused_until = greatest(paused_until, $2) WHERE id = $1;

-- name: prunable
-- Finished intents (delivered, cancelled) last changed before a time, oldest first, up to $2 (null: all).
SELECT action_id FROM intents
WHERE status IN ('delivered', 'cancelled') AND updated_at < $1 ORDER BY updated_at, seq LIMIT $2;

-- name: prune
-- Delete up to $2 of the prunable intents with their attempts and events; returns their action ids, oldest first.
-- Rows locked by a writer are left for the next batch rather than waited for.
WITH doomed AS (
    SELECT seq, action_id, updated_at FROM intents
    WHERE status IN ('delivered', 'cancelled') AND updated_at < $1 ORDER BY updated_at, seq LIMIT $2
    FOR UPDATE SKIP LOCKED
), events_gone AS (
    DELETE FROM events WHERE intent_seq IN (SELECT seq FROM doomed)
), attempts_gone AS (
    DELETE FROM attempts WHERE intent_seq IN (SELECT seq FROM doomed)
), intents_gone AS (
    DELETE FROM intents WHERE seq IN (SELECT seq FROM doomed)
)
SELECT action_id FROM doomed ORDER BY updated_at, seq;

-- name: count_by_status
-- The backlog by status and channel (metrics).
SELECT status, channel, count(*) FROM intent_records GROUP BY status, channel;

-- name: oldest_due
-- When the oldest due intent (unleased) fell due (metrics: how far behind delivery is).
SELECT min(next_attempt_at) FROM intents AS due WHERE status = 'pending' AND next_attempt_at <= $1
  AND {holds_no_lease[due]};

-- name: logged
-- The events of a move's batch (arrays $1-$6: the change's place in the batch, kind, time, actor, reason, data), each
-- appended to the intent its change moved ("changed": seq, n), in order, after the "leased" fact of a lease the change
-- ends if it is recorded nowhere yet (unrecorded_lease: the lease row as the statement found it, which the statement
-- deletes). Filled into each move's block as {logged}.
-- Each block also names its keys as "= ANY($intent_key)" beside its join on them: the batch's intents are then found
-- by one scan of intents_intent_key_key, whatever the statistics say of the batch or the table.
logged AS (
    INSERT INTO events (intent_seq, kind, at, actor, reason, data)
    SELECT seq, kind, at, actor, reason, data FROM (
        SELECT before.intent_seq AS seq, changed.n, 0::bigint AS i, 'leased' AS kind, before.leased_at AS at,
               before.lease_owner AS actor, NULL::text AS reason, jsonb_build_object('fence', before.fence) AS data
        FROM changed JOIN intent_leases AS before ON before.intent_seq = changed.seq  -- (the statement's snapshot)
        WHERE {unrecorded_lease[before]}
        UNION ALL
        SELECT changed.seq, changed.n, e.i, e.kind, e.at, e.actor, e.reason, e.data::jsonb
        FROM changed JOIN unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::text[], $5::text[], $6::text[])
            WITH ORDINALITY AS e (n, kind, at, actor, reason, data, i) USING (n)
    ) AS written
    ORDER BY n, i
)

-- name: cycle
-- A worker's cycle as one statement: moves settle and start for a batch each, then a claim. Arrays $1-$6 are the
-- events of both (as logged takes them: n is the change's place, the settles first, then the starts); the others are
-- named (outbox/store/postgres/changes.py fills them by name): $settle_* the settles (key, fence, fate, last_error,
-- next_attempt_at, attempts and new fence (null: kept), updated_at, then the attempt, none where its id is null),
-- $start_* the starts (key, fence, then the attempt), each with held, the events its attempt keeps (timeline.group's
-- JSON, as held_group stores it); $claim_* the claim (now, owner, lease until, limit: 0 claims nothing). Any of the
-- arrays may be empty.
-- A lease is its intent_leases row, whose fence is always one above the intent's stored one (the claim makes it so, and
-- neither changes while the lease is held): "still leased at its fence F" is a lease row beside a stored fence of F - 1,
-- judged on the intent's row (every move that ends a lease raises the stored fence to the lease's at least, so a move
-- that waited on the row lock of one that ended the lease finds the row changed and is refused), and the lease row
-- found from it by its key (never matched to a change by fence: all leases' fences may be alike).
-- - settle: each intent still leased at its fence takes its fate, its row written once and its lease row deleted, its
--   attempt inserted or finished with its events (those of a settle with no attempt appended to events);
-- - start: each intent still leased at its fence, with its lease unexpired when the attempt starts, is locked FOR
--   KEY SHARE (a sweeper's recover, FOR UPDATE, then skips it until the attempt is in) and gets its attempt row,
--   unfinished, holding its event; the intent row is not written;
-- - claim: up to $claim_limit of the oldest due intents, locked, get a lease row each (fence one above the stored one);
--   the intents' rows are not written and no event is (the lease's "leased" fact is recorded by its attempt's start,
--   or by the move that ends it: unrecorded_lease). Rows another claimer has locked are skipped, never waited for. A
--   row whose lease a claimer committed after this statement's snapshot is locked all the same (the claim did not
--   write it), and its lease refused by the key of intent_leases: "refused" counts those, which the store claims again
--   in a statement of its own. An intent of an ordered destination waits while an earlier one of its key is in the way
--   (one seek of intents_ordering); the earlier one a concurrent claimer has just locked is still pending in this
--   snapshot, and stays stored so.
--   Intents of destinations with a limit or a pause (limited) are left to outbox_claim_limited (migration 0013),
--   called only when there are such destinations: it leases what their limits allow, under a lock of each one's
--   bucket row, and says what it held back ("held": destination, paused, in_flight, rate, retry at as epoch
--   seconds); the rest of $claim_limit goes to the others, whose claim touches no further row and takes no further lock.
-- All parts see one snapshot, so the claim never picks what this statement's settles make due: a later cycle does.
-- The parts touch disjoint rows (settled and started intents are leased, claimed ones pending). One row comes back
-- at least: the places settled and started (null: none) and the claim's refused, beside each claimed intent's record
-- and its event_payload (all null: none).
WITH settling AS (
    SELECT * FROM unnest($settle_intent_key::text[], $settle_fence::bigint[], $settle_status::text[], $settle_last_error::text[], $settle_next_attempt_at::timestamptz[], $settle_attempts::integer[],
                         $settle_new_fence::bigint[], $settle_updated_at::timestamptz[], $settle_attempt_id::text[], $settle_number::integer[], $settle_attempt_fence::bigint[], $settle_worker::text[],
                         $settle_started_at::timestamptz[], $settle_finished_at::timestamptz[], $settle_submission::text[], $settle_outcome::text[], $settle_status_code::integer[], $settle_reply::text[],
                         $settle_external_id::text[], $settle_error::text[], $settle_duration_ms::float8[], $settle_stage::text[], $settle_held::text[])
        WITH ORDINALITY AS b (intent_key, fence, status, last_error, next_attempt_at, attempts, new_fence, updated_at,
                              attempt_id, number, attempt_fence, worker, started_at, finished_at, submission, outcome,
                              status_code, reply, external_id, error, duration_ms, stage, held, n)
), settled AS (
    UPDATE intents SET status = b.status, last_error = b.last_error,
                       next_attempt_at = coalesce(b.next_attempt_at, intents.next_attempt_at),
                       attempts = coalesce(b.attempts, intents.attempts), fence = coalesce(b.new_fence, lease.fence),
                       updated_at = b.updated_at
    FROM settling AS b, intent_leases AS lease
    WHERE intents.intent_key = ANY($settle_intent_key::text[]) AND intents.intent_key = b.intent_key
      AND {still_leased[intents, lease, b.fence]}
    RETURNING intents.seq, intents.status, b.n, b.attempt_id, {lease_entry[lease]} AS lease,
              {unrecorded_lease[lease]} AS unrecorded
), settled_leases AS (
    DELETE FROM intent_leases WHERE intent_seq IN (SELECT seq FROM settled)
), finished AS (
    INSERT INTO attempts (attempt_id, intent_seq, number, fence, worker, started_at, finished_at,
                          submission, outcome, status_code, reply, external_id, error, duration_ms, stage, events)
    SELECT b.attempt_id, settled.seq, b.number, b.attempt_fence, b.worker, b.started_at, b.finished_at, b.submission,
           b.outcome, b.status_code, b.reply, b.external_id, b.error, b.duration_ms, b.stage,
           {held_group[settled.seq, kept]}
    FROM settled JOIN settling AS b USING (n)
    CROSS JOIN LATERAL (SELECT CASE WHEN settled.unrecorded THEN jsonb_build_array(settled.lease) ELSE '[]'::jsonb END
                               || b.held::jsonb AS kept) AS k
    WHERE b.attempt_id IS NOT NULL ORDER BY n
    ON CONFLICT (attempt_id) DO UPDATE SET
        finished_at = excluded.finished_at, submission = excluded.submission,
        outcome = excluded.outcome, status_code = excluded.status_code, reply = excluded.reply,
        external_id = excluded.external_id, error = excluded.error, duration_ms = excluded.duration_ms,
        stage = excluded.stage, events = attempts.events || excluded.events
), starting AS (
    SELECT intent_key, fence, attempt_id, number, attempt_fence, worker, started_at, held,
           i + cardinality($settle_intent_key::text[]) AS n
    FROM unnest($start_intent_key::text[], $start_fence::bigint[], $start_attempt_id::text[], $start_number::integer[], $start_attempt_fence::bigint[], $start_worker::text[],
                $start_started_at::timestamptz[], $start_held::text[])
        WITH ORDINALITY AS b (intent_key, fence, attempt_id, number, attempt_fence, worker, started_at, held, i)
), started AS (
    SELECT intents.seq, starting.*,
           CASE WHEN {unrecorded_lease[lease]} THEN jsonb_build_array({lease_entry[lease]}) ELSE '[]'::jsonb END
           || starting.held::jsonb AS kept
    FROM intents JOIN starting USING (intent_key) CROSS JOIN intent_leases AS lease
    WHERE intents.intent_key = ANY($start_intent_key::text[]) AND {still_leased[intents, lease, starting.fence]}
      AND {lease_running}
    FOR KEY SHARE OF intents
), attempted AS (
    INSERT INTO attempts (attempt_id, intent_seq, number, fence, worker, started_at, events)
    SELECT attempt_id, seq, number, attempt_fence, worker, started_at, {held_group[seq, kept]} FROM started ORDER BY n
    ON CONFLICT (attempt_id) DO NOTHING
), changed AS (  -- (the settles that record no attempt: the others' attempts keep their events)
    SELECT seq, n FROM settled WHERE attempt_id IS NULL
), {logged}, limited AS MATERIALIZED (
    SELECT id FROM destinations WHERE $claim_limit > 0 AND {limited}
), flow AS MATERIALIZED (
    SELECT * FROM outbox_claim_limited($claim_owner, $claim_now, $claim_lease_until, $claim_limit) WHERE EXISTS (SELECT 1 FROM limited)
), due AS (  -- (the rows as locked: a row changed since the snapshot is read as changed)
    SELECT * FROM intents AS due
    WHERE status = 'pending' AND next_attempt_at <= $claim_now
      AND {holds_no_lease[due]}
      AND due.destination <> ALL (ARRAY(SELECT id FROM limited))
      AND {claimable}
    ORDER BY next_attempt_at LIMIT $claim_limit - (SELECT coalesce(sum(cardinality(flow_leased)), 0) FROM flow)
    FOR UPDATE OF due SKIP LOCKED
), leased AS (
    INSERT INTO intent_leases (intent_seq, destination, lease_owner, lease_expires_at, fence, leased_at)
    SELECT seq, destination, $claim_owner, $claim_lease_until, fence + 1, $claim_now FROM due
    ON CONFLICT (intent_seq) DO NOTHING
    RETURNING *
), records AS (
    SELECT {leased_record[due, leased]} FROM due JOIN leased ON leased.intent_seq = due.seq
)
SELECT (SELECT array_agg(n) FROM settled) AS settled_places, (SELECT array_agg(n) FROM started) AS started_places,
       (SELECT count(*) FROM due) - (SELECT count(*) FROM leased) AS refused,
       (SELECT pg_notify('outbox_due', '') FROM settled WHERE status = 'pending' LIMIT 1) AS notified,
       (SELECT json_agg(json_build_array(flow_destination, held_paused, held_in_flight, held_rate, flow_retry_at))
        FROM flow WHERE held_paused + held_in_flight + held_rate > 0) AS held, claimed.*,
       {event_payload[claimed]} AS event_payload
FROM (VALUES (true)) AS one
LEFT JOIN (SELECT * FROM records UNION ALL SELECT took.* FROM flow, unnest(flow_leased) AS took) AS claimed ON true
ORDER BY claimed.next_attempt_at;

-- name: release
-- Move release for a batch (arrays $1-$6 its events, as logged takes them; then named: $intent_key, $fence,
-- $next_attempt_at, $updated_at): each intent still leased at its fence (as the cycle's settle judges it) is pending
-- again, unsent, its lease row deleted. Returns the places applied.
WITH changed AS (
    UPDATE intents SET status = 'pending', fence = lease.fence, next_attempt_at = b.next_attempt_at,
                       updated_at = b.updated_at
    FROM unnest($intent_key::text[], $fence::bigint[], $next_attempt_at::timestamptz[], $updated_at::timestamptz[])
        WITH ORDINALITY AS b (intent_key, fence, next_attempt_at, updated_at, n)
        CROSS JOIN intent_leases AS lease
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key
      AND {still_leased[intents, lease, b.fence]}
    RETURNING intents.seq, b.n
), ended AS (
    DELETE FROM intent_leases WHERE intent_seq IN (SELECT seq FROM changed)
), {logged}
SELECT n, pg_notify('outbox_due', '') AS notified FROM changed;

-- name: hold
-- Move hold for a batch (arrays $1-$6 its events; then named: $intent_key, $fence, $last_error, $updated_at): each
-- intent still leased at its fence (as the cycle's settle judges it) waits for an operator's approval, its lease row
-- deleted. Returns the places applied.
WITH changed AS (
    UPDATE intents SET status = 'held', fence = lease.fence, last_error = b.last_error, updated_at = b.updated_at
    FROM unnest($intent_key::text[], $fence::bigint[], $last_error::text[], $updated_at::timestamptz[])
        WITH ORDINALITY AS b (intent_key, fence, last_error, updated_at, n)
        CROSS JOIN intent_leases AS lease
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key
      AND {still_leased[intents, lease, b.fence]}
    RETURNING intents.seq, b.n
), ended AS (
    DELETE FROM intent_leases WHERE intent_seq IN (SELECT seq FROM changed)
), {logged}
SELECT n FROM changed;

-- name: replay
-- Move replay for a batch (arrays $1-$6 its events; then named: $intent_key, $expected status, $next_attempt_at,
-- $max_attempts, $updated_at): each intent still in the status its caller saw is pending with a fresh budget (its
-- retry schedule starting over). Returns the places applied, with the rows.
WITH changed AS (
    UPDATE intents SET status = 'pending', next_attempt_at = b.next_attempt_at, max_attempts = b.max_attempts,
                       last_error = NULL, updated_at = b.updated_at, replayed_after = intents.attempts
    FROM unnest($intent_key::text[], $expected::text[], $next_attempt_at::timestamptz[], $max_attempts::integer[],
                $updated_at::timestamptz[])
        WITH ORDINALITY AS b (intent_key, expected, next_attempt_at, max_attempts, updated_at, n)
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key AND intents.status = b.expected
    RETURNING intents.*, {unleased}, {event_payload[intents]} AS event_payload, b.n
), {logged}
SELECT *, pg_notify('outbox_due', '') AS notified FROM changed;

-- name: resolve
-- Move resolve for a batch (arrays $1-$6 its events; then named: $intent_key, $status, $next_attempt_at and
-- $max_attempts (null: kept; given, a retry schedule starts over), $updated_at): each intent still unknown becomes
-- its status. Returns the places applied, with the rows.
WITH changed AS (
    UPDATE intents SET status = b.status, next_attempt_at = coalesce(b.next_attempt_at, intents.next_attempt_at),
                       max_attempts = coalesce(b.max_attempts, intents.max_attempts), updated_at = b.updated_at,
                       replayed_after = CASE WHEN b.max_attempts IS NULL THEN intents.replayed_after
                                             ELSE intents.attempts END
    FROM unnest($intent_key::text[], $status::text[], $next_attempt_at::timestamptz[], $max_attempts::integer[],
                $updated_at::timestamptz[])
        WITH ORDINALITY AS b (intent_key, status, next_attempt_at, max_attempts, updated_at, n)
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key AND intents.status = 'unknown'
    RETURNING intents.*, {unleased}, {event_payload[intents]} AS event_payload, b.n
), {logged}
SELECT *, CASE WHEN status = 'pending' THEN pg_notify('outbox_due', '') END AS notified FROM changed;

-- name: cancel
-- Move cancel for a batch (arrays $1-$6 its events; then named: $intent_key, $expected status, $updated_at): each
-- intent still in the status its caller saw, and holding no lease, is withdrawn. Returns the places applied, with the
-- rows. The store runs it after lock_intents in one transaction: a claim leases a pending intent without writing its
-- row, so the lease it committed while this waited on the row's lock is seen only by a statement that begins after
-- the lock is held.
WITH changed AS (
    UPDATE intents SET status = 'cancelled', updated_at = b.updated_at
    FROM unnest($intent_key::text[], $expected::text[], $updated_at::timestamptz[])
        WITH ORDINALITY AS b (intent_key, expected, updated_at, n)
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key AND intents.status = b.expected
      AND {holds_no_lease[intents]}
    RETURNING intents.*, {unleased}, {event_payload[intents]} AS event_payload, b.n
), {logged}
SELECT * FROM changed;

-- name: approve
-- Move approve for a batch (arrays $1-$6 its events; then named: $intent_key, $approved_digest, the approval's
-- expiry $approval_expires_at, the approver $approved_by, $next_attempt_at, $updated_at): each intent still held is
-- pending under its approval. Returns the places applied, with the rows.
WITH changed AS (
    UPDATE intents SET status = 'pending', approved_digest = b.approved_digest,
                       approval_expires_at = b.approval_expires_at, approved_by = b.approved_by,
                       next_attempt_at = b.next_attempt_at, updated_at = b.updated_at
    FROM unnest($intent_key::text[], $approved_digest::text[], $approval_expires_at::timestamptz[],
                $approved_by::text[], $next_attempt_at::timestamptz[], $updated_at::timestamptz[])
        WITH ORDINALITY AS b (intent_key, approved_digest, approval_expires_at, approved_by, next_attempt_at,
                              updated_at, n)
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key AND intents.status = 'held'
    RETURNING intents.*, {unleased}, {event_payload[intents]} AS event_payload, b.n
), {logged}
SELECT *, pg_notify('outbox_due', '') AS notified FROM changed;

-- name: reject
-- Move reject for a batch (arrays $1-$6 its events; then named: $intent_key, $updated_at): each intent still held is
-- cancelled, never sent. Returns the places applied, with the rows.
WITH changed AS (
    UPDATE intents SET status = 'cancelled', updated_at = b.updated_at
    FROM unnest($intent_key::text[], $updated_at::timestamptz[]) WITH ORDINALITY AS b (intent_key, updated_at, n)
    WHERE intents.intent_key = ANY($intent_key::text[]) AND intents.intent_key = b.intent_key AND intents.status = 'held'
    RETURNING intents.*, {unleased}, {event_payload[intents]} AS event_payload, b.n
), {logged}
SELECT * FROM changed;

-- name: lock_intents
-- Lock the intents of keys $1, in key order, until the transaction ends: a claim skips them meanwhile, and the
-- transaction's next statement sees every lease committed before (cancel).
SELECT seq FROM intents WHERE intent_key = ANY($1::text[]) ORDER BY intent_key FOR UPDATE;

-- name: lock_recoverable
-- The sweeper's pick for move recover: up to $2 leases expired by $1 with no attempt in flight under their fence,
-- oldest first, locked FOR UPDATE (a Start's FOR KEY SHARE and this wait for each other); rows another transaction
-- has locked are skipped. Returns each one's seq and lease owner.
SELECT intents.seq, lease.lease_owner FROM intent_leases AS lease JOIN intents ON intents.seq = lease.intent_seq
WHERE lease.lease_expires_at <= $1
  AND NOT EXISTS (SELECT 1 FROM attempts
                  WHERE attempts.intent_seq = lease.intent_seq AND attempts.fence = lease.fence
                    AND attempts.finished_at IS NULL)
ORDER BY lease.lease_expires_at LIMIT $2
FOR UPDATE OF intents SKIP LOCKED;

-- name: recover
-- Move recover for the intents lock_recoverable locked (arrays $1, $2: seq, its event's reason), judged again in this
-- statement's snapshot, taken after the locks: one whose holder's attempt start committed meanwhile is left (its
-- attempt is settled by the sweeper instead), and so is one whose lease was renewed past $3 meanwhile (the renewal
-- writes the lease row only, which the delete here waits for and then judges again). The rest lose their lease row
-- and are pending and due at $3, fence raised above the lease's, with a lease_expired event by $4 (data $5). Returns
-- those recovered.
WITH ended AS (
    DELETE FROM intent_leases AS lease USING unnest($1::bigint[], $2::text[]) AS held (seq, reason)
    WHERE lease.intent_seq = ANY($1::bigint[]) AND lease.intent_seq = held.seq AND lease.lease_expires_at <= $3
      AND NOT EXISTS (SELECT 1 FROM attempts
                      WHERE attempts.intent_seq = lease.intent_seq AND attempts.fence = lease.fence
                        AND attempts.finished_at IS NULL)
    RETURNING lease.*, held.reason, {unrecorded_lease[lease]} AS unrecorded
), changed AS (
    UPDATE intents SET next_attempt_at = $3, fence = ended.fence + 1, updated_at = $3
    FROM ended WHERE intents.seq = ended.intent_seq
    RETURNING intents.seq, ended.reason
), logged AS (  -- each after its lease's "leased" fact if recorded nowhere yet (unrecorded_lease)
    INSERT INTO events (intent_seq, kind, at, actor, reason, data)
    SELECT seq, kind, at, actor, reason, data FROM (
        SELECT intent_seq AS seq, 0 AS i, 'leased' AS kind, leased_at AS at, lease_owner AS actor,
               NULL::text AS reason, jsonb_build_object('fence', fence) AS data
        FROM ended WHERE unrecorded
        UNION ALL
        SELECT seq, 1, 'lease_expired', $3, $4, reason, $5::jsonb FROM changed
    ) AS written
    ORDER BY seq, i
)
SELECT seq, pg_notify('outbox_due', '') AS notified FROM changed;

-- name: first_submission
-- When an intent's first attempt that may have reached the receiver started.
SELECT min(attempts.started_at) FROM attempts JOIN intents ON intents.seq = attempts.intent_seq
WHERE intents.intent_key = $1 AND (attempts.submission IS NULL OR attempts.submission != 'not_submitted');

-- name: disable_destination
-- Stop sending to a destination (the receiver answered 410 Gone).
UPDATE destinations SET disabled = true, updated_at = $1 WHERE id = $2;

-- name: put_grant
-- Create or replace a grant, bumping its revision.
INSERT INTO grants (id, scope, destination, revision, expires_at, note, created_at, updated_at)
VALUES ($1, $2, $3, 1, $4, $5, $6, $7)
ON CONFLICT (id) DO UPDATE SET
    scope = excluded.scope, destination = excluded.destination, revision = grants.revision + 1,
    expires_at = excluded.expires_at, note = excluded.note, updated_at = excluded.updated_at
RETURNING *;

-- name: grant_by_id
-- One grant.
SELECT * FROM grants WHERE id = $1;

-- name: list_grants
-- Every grant, by id.
SELECT * FROM grants ORDER BY id;

-- name: delete_grant
-- Remove a grant; returns its id, or nothing if there was none.
DELETE FROM grants WHERE id = $1 RETURNING id;

-- name: matching_grant
-- A live grant letting a scope reach a destination (exact destination first).
SELECT * FROM grants
WHERE scope = $1 AND destination IN ($2, '*') AND (expires_at IS NULL OR expires_at > $3)
ORDER BY destination = '*', revision DESC LIMIT 1;

-- name: status_in
-- A listing's condition that a record's status (intent_records') is one of the array {values}: said again of its stored
-- status (a leased one's is 'pending'), which intents_status indexes, so that a rare status is found through it.
(status = ANY({values}) AND stored_status = ANY(array_replace({values}, 'leased', 'pending')))

-- name: list_intents
-- A page of intents, newest first, after a cursor: $1 rows at most, {where} conditions on $2 onwards.
SELECT *, {event_payload[intents]} AS event_payload FROM intent_records AS intents WHERE {where}
ORDER BY seq DESC LIMIT $1;

-- name: put_destination
-- Register or replace a destination; returns whether it was new (not there when the statement began).
WITH existing AS (SELECT id FROM destinations WHERE id = $1)
INSERT INTO destinations (id, channel, settings, secrets, idempotent, retention_seconds, on_unknown,
                          timeout_seconds, requires_approval, allow_private_network, disabled,
                          created_at, updated_at, reconcile, ordering, ordering_on_dead,
                          retry_schedule, max_age_seconds, subscriptions, rate_per_second,
                          rate_burst, max_in_flight, owner, previous_secrets_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)
ON CONFLICT (id) DO UPDATE SET
    channel = excluded.channel, settings = excluded.settings, secrets = excluded.secrets,
    idempotent = excluded.idempotent, retention_seconds = excluded.retention_seconds,
    on_unknown = excluded.on_unknown, timeout_seconds = excluded.timeout_seconds,
    requires_approval = excluded.requires_approval,
    allow_private_network = excluded.allow_private_network, disabled = excluded.disabled,
    updated_at = excluded.updated_at, reconcile = excluded.reconcile, ordering = excluded.ordering,
    ordering_on_dead = excluded.ordering_on_dead, retry_schedule = excluded.retry_schedule,
    max_age_seconds = excluded.max_age_seconds, subscriptions = excluded.subscriptions,
    rate_per_second = excluded.rate_per_second, rate_burst = excluded.rate_burst,
    max_in_flight = excluded.max_in_flight, owner = excluded.owner,
    previous_secrets_until = excluded.previous_secrets_until
RETURNING NOT EXISTS (SELECT 1 FROM existing) AS created;

-- name: sealing_key
-- The id of the key destination secrets are sealed under (no row: nothing sealed yet).
SELECT key_id FROM secrets_key;

-- name: propose_sealing_key
-- Name the key to seal under, unless one is named already (read it back, locked, below).
INSERT INTO secrets_key (key_id) VALUES ($1) ON CONFLICT (only_row) DO NOTHING;

-- name: share_sealing_key
-- The key to seal under, locked against a rotation until this write's transaction ends.
SELECT key_id FROM secrets_key FOR SHARE;

-- name: lock_sealing_key
-- The key sealed under, locked while a rotation seals everything again (writers of secrets wait).
SELECT key_id FROM secrets_key FOR UPDATE;

-- name: set_sealing_key
-- Name the key to seal under, in the transaction that sealed every destination's secrets under it.
UPDATE secrets_key SET key_id = $1;

-- name: destination_secrets
-- Every destination's stored secrets, by id (to seal them again).
SELECT id, secrets FROM destinations ORDER BY id;

-- name: lock_destination_secrets
-- Every destination's stored secrets, by id, locked until they are sealed again.
SELECT id, secrets FROM destinations ORDER BY id FOR UPDATE;

-- name: put_destination_secrets
-- Replace one destination's stored secrets (sealed again).
UPDATE destinations SET secrets = $2 WHERE id = $1;

-- name: destination_by_id
-- One destination.
SELECT * FROM destinations WHERE id = $1;

-- name: lock_destination
-- A destination, locked until its deletion's transaction ends: no intent can name it meanwhile.
SELECT id FROM destinations WHERE id = $1 FOR UPDATE;

-- name: list_destinations
-- Every destination, by id.
SELECT * FROM destinations ORDER BY id;

-- name: owned_destinations
-- The destinations one scope owns, by id.
SELECT * FROM destinations WHERE owner = $1 ORDER BY id;

-- name: owned_counts
-- How many destinations scope $1 owns besides $2, and how many subscriptions those hold.
SELECT (SELECT count(*) FROM destinations WHERE owner = $1 AND id <> $2) AS destinations,
       (SELECT count(*) FROM subscriptions AS s JOIN destinations AS d ON d.id = s.destination
        WHERE d.owner = $1 AND d.id <> $2) AS subscriptions;

-- name: lock_owner
-- Puts of one owner's destinations take turns until their transactions end, so its limits are counted whole.
SELECT pg_advisory_xact_lock(hashtext('outbox.destinations'), hashtext($1));

-- name: open_intents_for_destination
-- How many intents still wait on a destination (it may not be deleted under them).
SELECT count(*) FROM intent_records WHERE destination = $1 AND status IN ('pending', 'leased', 'held', 'unknown');

-- name: any_intent_for_destination
-- Whether any intent, even finished, names the destination (its history keeps the reference).
SELECT 1 FROM intents WHERE destination = $1 LIMIT 1;

-- name: grants_for_destination
-- The grants that name a destination (it may not be deleted under them).
SELECT id FROM grants WHERE destination = $1 ORDER BY id;

-- name: delete_destination
-- Remove a destination.
DELETE FROM destinations WHERE id = $1;

-- name: insert_token
-- Store a new token's hash.
INSERT INTO tokens (id, hash, role, scopes, label, created_at) VALUES ($1, $2, $3, $4, $5, $6);

-- name: token_by_hash
-- The token a bearer presents, if it is not revoked.
SELECT * FROM tokens WHERE hash = $1 AND revoked_at IS NULL;

-- name: list_tokens
-- Every token, oldest first.
SELECT * FROM tokens ORDER BY created_at, id;

-- name: revoke_token
-- Revoke token $2 at $1 (with $3, unless it is the last active admin token); returns it, or
-- nothing. Every active admin row is locked first, in id order, so of two revocations at once
-- the second waits for the first and counts again: they cannot both pass.
WITH admins AS (
  SELECT id FROM tokens WHERE role = 'admin' AND revoked_at IS NULL ORDER BY id FOR UPDATE
)
UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL
  AND (NOT $3 OR role <> 'admin' OR (SELECT count(*) FROM admins WHERE admins.id <> $2) > 0)
RETURNING *;

-- name: token_by_id
-- A token by its id, revoked or not.
SELECT * FROM tokens WHERE id = $1;

-- name: count_active_tokens
-- Active tokens of a role.
SELECT count(*) FROM tokens WHERE role = $1 AND revoked_at IS NULL;

-- name: prune_console_sessions
-- Drop the console sessions expired at $1, and those opened with a token since revoked.
DELETE FROM console_sessions
WHERE expires_at <= $1 OR token_id IN (SELECT id FROM tokens WHERE revoked_at IS NOT NULL);

-- name: insert_console_session
-- Store a new console session (the hash of its id).
INSERT INTO console_sessions (id_hash, token_id, created_at, expires_at) VALUES ($1, $2, $3, $4);

-- name: trim_console_sessions
-- Keep token $1's newest $2 console sessions, dropping the older ones.
DELETE FROM console_sessions WHERE token_id = $1 AND id_hash NOT IN (
  SELECT id_hash FROM console_sessions WHERE token_id = $1 ORDER BY created_at DESC, id_hash DESC LIMIT $2);

-- name: console_session
-- The token of console session $1, if the session is unexpired at $2 and the token not revoked.
SELECT t.* FROM console_sessions s JOIN tokens t ON t.id = s.token_id
WHERE s.id_hash = $1 AND s.expires_at > $2 AND t.revoked_at IS NULL;

-- name: close_console_session
-- Remove a console session (signing out).
DELETE FROM console_sessions WHERE id_hash = $1;

-- name: prune_portal_links
-- Drop the portal links unopened past their expiry at $1, the sessions ended by $1, and those of revoked tokens.
DELETE FROM portal_links
WHERE (session_hash IS NULL AND expires_at <= $1) OR session_expires_at <= $1
   OR token_id IN (SELECT id FROM tokens WHERE revoked_at IS NOT NULL);

-- name: insert_portal_link
-- Store a new portal link (the hash of its token).
INSERT INTO portal_links (link_hash, token_id, scope, read_only, session_seconds, created_at, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: open_portal_link
-- Open link $1 once, at $3, for session $2, if it is unopened, unexpired and its token not revoked: its scope,
-- read-only flag and the session's end (no row: expired, opened already, revoked or none).
UPDATE portal_links SET session_hash = $2, session_expires_at = $3 + session_seconds * interval '1 second'
WHERE link_hash = $1 AND session_hash IS NULL AND expires_at > $3
  AND EXISTS (SELECT 1 FROM tokens t WHERE t.id = portal_links.token_id AND t.revoked_at IS NULL)
RETURNING scope, read_only, session_expires_at;

-- name: portal_session
-- The scope, read-only flag and end of portal session $1, if it is unexpired at $2 and its link's token not revoked.
SELECT l.scope, l.read_only, l.session_expires_at FROM portal_links l JOIN tokens t ON t.id = l.token_id
WHERE l.session_hash = $1 AND l.session_expires_at > $2 AND t.revoked_at IS NULL;

-- name: close_portal_session
-- Remove portal session $1 with its link (signing out): the link cannot open again, being gone.
DELETE FROM portal_links WHERE session_hash = $1;

-- name: activity_minutes
-- Attempts started since $1 and finished, per destination, minute of their finish and outcome:
-- count, summed duration, last end.
SELECT i.destination, date_trunc('minute', a.finished_at) AS minute, a.outcome, count(*),
       coalesce(sum(a.duration_ms), 0)::float8, max(a.finished_at)
FROM attempts a JOIN intents i ON i.seq = a.intent_seq
WHERE a.started_at >= $1 AND a.finished_at IS NOT NULL GROUP BY i.destination, minute, a.outcome;

-- name: activity_failures
-- Each destination's latest failed attempt of those started since $1.
SELECT DISTINCT ON (i.destination) i.destination, a.finished_at, a.outcome, a.status_code, a.error
FROM attempts a JOIN intents i ON i.seq = a.intent_seq
WHERE a.started_at >= $1 AND a.outcome <> 'delivered' ORDER BY i.destination, a.finished_at DESC;

-- name: destination_counts
-- A destination's intents by status (through its index).
SELECT status, count(*) FROM intent_records WHERE destination = $1 GROUP BY status;

-- name: destination_failures
-- A destination's failed attempts of those started since $2, newest first, at most $3.
SELECT i.action_id, i.scope, a.number, a.finished_at, a.submission, a.outcome, a.status_code, a.error
FROM attempts a JOIN intents i ON i.seq = a.intent_seq
WHERE i.destination = $1 AND a.started_at >= $2 AND a.outcome <> 'delivered'
ORDER BY a.finished_at DESC, a.attempt_id DESC LIMIT $3;

-- name: activity_waiting
-- Each destination's open intents and when its oldest due one (at $1) fell due.
SELECT destination, count(*), min(next_attempt_at) FILTER (WHERE status = 'pending' AND next_attempt_at <= $1)
FROM intent_records WHERE status IN ('pending', 'leased', 'held') GROUP BY destination;

-- name: activity_backlog
-- Open intents by the minute they were enqueued (at least $1's), and intents settled since $1 by the minutes
-- they were enqueued and last changed.
SELECT date_trunc('minute', greatest(created_at, $1)) AS since, NULL::timestamptz, count(*)
FROM intent_records WHERE status IN ('pending', 'leased', 'held') GROUP BY 1
UNION ALL
SELECT date_trunc('minute', greatest(created_at, $1)), date_trunc('minute', updated_at), count(*)
FROM intents WHERE status IN ('delivered', 'cancelled') AND updated_at >= $1 GROUP BY 1, 2
UNION ALL
SELECT date_trunc('minute', greatest(created_at, $1)), date_trunc('minute', updated_at), count(*)
FROM intents WHERE status IN ('dead', 'unknown', 'revoked') AND updated_at >= $1 GROUP BY 1, 2;

-- name: delete_subscriptions
-- A destination's subscription rows (replaced with it, or removed before it).
DELETE FROM subscriptions WHERE destination = $1;

-- name: insert_subscriptions
-- A destination's subscription rows, from arrays of destination, prefix, exact and scope.
INSERT INTO subscriptions (destination, prefix, exact, scope)
SELECT * FROM unnest($1::text[], $2::text[], $3::boolean[], $4::text[]);

-- name: event_subscribers
-- The destinations subscribed to topic $2 for scope $1 (with $4, only those the scope holds a grant for that is live
-- at $3, as matching_grant judges; an owned one only for its owner, whose grant it implies), by id, with what an
-- enqueue needs to know of each.
SELECT d.id, d.channel, d.requires_approval, d.owner FROM destinations d
WHERE EXISTS (SELECT 1 FROM subscriptions s
              WHERE s.destination = d.id AND (s.scope IS NULL OR s.scope = $1)
                AND CASE WHEN s.exact THEN s.prefix = $2 ELSE starts_with($2, s.prefix) END)
  AND CASE WHEN d.owner IS NOT NULL THEN d.owner = $1
           ELSE NOT $4::boolean OR EXISTS (SELECT 1 FROM grants g
                                           WHERE g.scope = $1 AND g.destination IN (d.id, '*')
                                             AND (g.expires_at IS NULL OR g.expires_at > $3)) END
ORDER BY d.id;

-- name: insert_topic_event
-- Record an event unless its key (scope/event_id) exists; returns the new seq, or nothing.
INSERT INTO topic_events (event_key, event_id, scope, topic, payload, payload_digest, ordering_key, actor, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (event_key) DO NOTHING
RETURNING seq;

-- name: insert_topic_events
-- Record a batch's events (arrays $1-$9, as insert_topic_event takes one), in order, each unless its key exists (an
-- earlier one's of the batch included); returns the key and seq of each one recorded.
INSERT INTO topic_events (event_key, event_id, scope, topic, payload, payload_digest, ordering_key, actor, created_at)
SELECT event_key, event_id, scope, topic, payload, payload_digest, ordering_key, actor, created_at
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::timestamptz[]) WITH ORDINALITY
    AS u (event_key, event_id, scope, topic, payload, payload_digest, ordering_key, actor, created_at, n)
ORDER BY n
ON CONFLICT (event_key) DO NOTHING
RETURNING event_key, seq;

-- name: events_subscribers
-- event_subscribers for a batch of events at once: for each (n, scope, topic, time) of arrays $1-$4, with $5 as its
-- $4, the destinations subscribed, as (n, id, channel, requires_approval, owner), by n then id.
SELECT e.n, d.id, d.channel, d.requires_approval, d.owner
FROM unnest($1::integer[], $2::text[], $3::text[], $4::timestamptz[]) AS e (n, scope, topic, at)
JOIN destinations d ON EXISTS (
    SELECT 1 FROM subscriptions s
    WHERE s.destination = d.id AND (s.scope IS NULL OR s.scope = e.scope)
      AND CASE WHEN s.exact THEN s.prefix = e.topic ELSE starts_with(e.topic, s.prefix) END)
WHERE CASE WHEN d.owner IS NOT NULL THEN d.owner = e.scope
           ELSE NOT $5::boolean OR EXISTS (SELECT 1 FROM grants g
                                           WHERE g.scope = e.scope AND g.destination IN (d.id, '*')
                                             AND (g.expires_at IS NULL OR g.expires_at > e.at)) END
ORDER BY e.n, d.id;

-- name: set_event_skipped
-- The subscribers an event made no intent for, as JSON [[destination, reason], ...].
UPDATE topic_events SET skipped = $1 WHERE seq = $2;

-- name: event_by_key
-- One event by its key (scope/event_id).
SELECT * FROM topic_events WHERE event_key = $1;

-- name: events_by_id
-- The events of every scope that use an event id (at most one per scope).
SELECT * FROM topic_events WHERE event_id = $1 ORDER BY scope;

-- name: intents_of_events
-- The intents of the events (scope, event_id) given as arrays $1 and $2.
SELECT i.*, {event_payload[i]} AS event_payload FROM intent_records i JOIN unnest($1::text[], $2::text[]) AS e (scope, event_id)
    ON i.scope = e.scope AND i.event_id = e.event_id
WHERE i.event_id IS NOT NULL
ORDER BY i.destination;

-- name: list_events
-- A page of events, newest first, after a cursor: $1 rows at most, {where} conditions on $2 onwards.
SELECT * FROM topic_events WHERE {where} ORDER BY seq DESC LIMIT $1;
