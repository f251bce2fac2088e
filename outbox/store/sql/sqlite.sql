-- The SQLite dialect. Each statement is a named block: "-- name: NAME" then a one-line purpose.
-- {placeholders} in braces are filled from fixed fragments in Python, never from user input.
-- Each move of outbox.model.MOVES that writes an intent row is the block named for it: one UPDATE over a JSON
-- array of rows, the intent's seq then what moves.written gives for the move in its order (updated_at last), each
-- judged by the store (rules.decide_target) in the same transaction; the operators' moves return the intents as
-- they became. Every statement that reads intents as records reads, beside each one's columns, {event_payload[row]}
-- (filled from the block event_payload for the intents row it names): an intent of an event sends the payload stored
-- once in the event's row (payload_event names it, migration 0018) and keeps none of its own; any other its own.

-- name: unrecorded_lease
-- Whether intents row {of} is leased under a lease whose "leased" fact is recorded nowhere yet (PostgreSQL's block says
-- why): neither in an attempt started under its fence nor as a "leased" row (one written before 0019).
({of}.status = 'leased'
 AND NOT EXISTS (SELECT 1 FROM attempts AS under WHERE under.intent_seq = {of}.seq AND under.fence = {of}.fence)
 AND NOT EXISTS (SELECT 1 FROM events AS lease WHERE lease.intent_seq = {of}.seq AND lease.kind = 'leased'
                                                 AND json_extract(lease.data, '$.fence') = {of}.fence))

-- name: event_payload
-- The payload stored once for the event the intents row {of} sends it for (payload_event); NULL: it has its own.
CASE WHEN {of}.payload_event IS NOT NULL
     THEN (SELECT shared.payload FROM topic_events AS shared WHERE shared.seq = {of}.payload_event) END

-- name: create_migrations_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at INTEGER NOT NULL
);

-- name: applied_migrations
-- Versions already applied.
SELECT version FROM schema_migrations ORDER BY version;

-- name: record_migration
-- Mark a migration applied, in the same transaction as its statements.
INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?);

-- name: take_write_lock
-- Take the database's write lock for the transaction this runs in, waiting for it as the connection's busy timeout
-- says (a first read would not: SQLite refuses a reading transaction the lock at once), and change nothing.
DELETE FROM schema_migrations WHERE false;

-- name: ping
-- Prove the database answers.
SELECT 1;

-- name: destination_for_enqueue
-- What an enqueue needs to know about its destination, read inside the enqueue's transaction (an owned one is
-- reached by its owner's intents only: outbox.store.intake.judged).
SELECT channel, requires_approval, owner FROM destinations WHERE id = ?;

-- name: insert_intent
-- Create an intent unless its key (scope/action_id) exists, while its destination ?4 still says what the intent was
-- judged on (a destination_for_enqueue row, read in this transaction or an earlier one): its channel ?5 and
-- requires_approval ?18 (?17: the event whose stored payload it sends, if any); returns the new seq, or nothing (the
-- key exists, or the destination says otherwise now).
INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                     max_attempts, next_attempt_at, not_before, expires_at, created_at, updated_at, ordering_key,
                     event_id, trace_context, payload_event)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13, ?14, ?15, ?16, ?17
FROM destinations WHERE id = ?4 AND channel = ?5 AND requires_approval = ?18
ON CONFLICT (intent_key) DO NOTHING
RETURNING seq;

-- name: insert_intents_set
-- Create the intents of a JSON array of [key, action_id, scope, destination, channel, payload,
-- payload_digest, status, max_attempts, next_attempt_at, not_before, expires_at, created_at,
-- ordering_key, event_id, trace_context, payload_event] rows, in order, each unless its key exists (an earlier
-- row's included); returns the key and new seq of each one created.
INSERT INTO intents (intent_key, action_id, scope, destination, channel, payload, payload_digest, status,
                     max_attempts, next_attempt_at, not_before, expires_at, created_at, updated_at, ordering_key,
                     event_id, trace_context, payload_event)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7,
       value ->> 8, value ->> 9, value ->> 10, value ->> 11, value ->> 12, value ->> 12, value ->> 13, value ->> 14,
       value ->> 15, value ->> 16
FROM json_each(?) WHERE true  -- (WHERE: so that ON CONFLICT is not read as a join's ON)
ON CONFLICT (intent_key) DO NOTHING
RETURNING intent_key, seq;

-- name: intent_by_key
-- One intent by its key (scope/action_id).
SELECT *, {event_payload[intents]} AS event_payload FROM intents WHERE intent_key = ?;

-- name: intents_by_keys
-- The intents holding any of the keys of a JSON array.
SELECT *, {event_payload[intents]} AS event_payload FROM intents WHERE intent_key IN (SELECT value FROM json_each(?));

-- name: intents_by_action
-- The intents of every scope that use an action id (at most one per scope).
SELECT *, {event_payload[intents]} AS event_payload FROM intents WHERE action_id = ? ORDER BY scope;

-- name: insert_event
-- Append to an intent's history.
INSERT INTO events (intent_seq, kind, at, actor, reason, data) VALUES (?, ?, ?, ?, ?, ?);

-- name: attempts_of
-- An intent's attempts, first to last.
SELECT * FROM attempts WHERE intent_seq = ? ORDER BY number;

-- name: lease_unrecorded
-- Whether intent ? is leased under a lease whose "leased" fact is recorded nowhere yet: its timeline reads it
-- from the intent's row.
SELECT {unrecorded_lease[intents]} FROM intents WHERE seq = ?;

-- name: events_of
-- The rows of an intent's history, oldest first (with what its attempts keep, its timeline: outbox/store/timeline.py).
SELECT id, kind, at, actor, reason, data FROM events WHERE intent_seq = ? ORDER BY id;

-- name: in_the_way
-- An intent ("earlier") in the way of a later one ("due") of its destination ("ordered", whose ordering is 'key') and
-- its key: open, or stopped (dead, revoked) while the destination blocks on them. The statuses are lifecycle's OPEN and
-- STOPPED, filled in by outbox.store.plumbing.with_ordering_rule, which fills the rule into claimable and
-- waiting_behind.
earlier.destination = due.destination AND earlier.ordering_key = due.ordering_key AND earlier.seq < due.seq
  AND earlier.status IN ({open}, {stopped})
  AND (earlier.status NOT IN ({stopped}) OR ordered.ordering_on_dead = 'block')

-- name: claimable
-- Not in the way of its key: an intent (as "due") of a destination with ordering 'key' waits while an earlier one
-- is in the way (in_the_way); one seek of intents_ordering. Filled into the statements that pick due intents.
(due.ordering_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM destinations AS ordered, intents AS earlier INDEXED BY intents_ordering
    WHERE ordered.id = due.destination AND ordered.ordering = 'key' AND {in_the_way}))

-- name: due_seqs
-- The oldest due intents' seqs, as one JSON array (the sender's claim picks these), leaving out an intent of an
-- ordered destination while an earlier one of its key is in the way (one seek of intents_ordering). The indexes
-- are named so the planner never trades them for others on a table without statistics.
SELECT json_group_array(seq) FROM (
    SELECT seq FROM intents AS due INDEXED BY intents_due
    WHERE status = 'pending' AND next_attempt_at <= ?
      AND {claimable}
    ORDER BY next_attempt_at LIMIT ?);

-- name: limited
-- A destination (as "destinations") with a limit or a pause at the time ?1: its intents are claimed by flow.
-- Filled into the statements that claim or look for due intents.
(max_in_flight IS NOT NULL OR rate_per_second IS NOT NULL OR paused_until > ?1)

-- name: flow_destinations
-- The destinations with a limit or a pause at ?1, by id, each with its bucket (tokens, refilled_at; null: none yet).
SELECT d.id, d.rate_per_second, d.rate_burst, d.max_in_flight, d.paused_until, b.tokens, b.refilled_at
FROM destinations AS d LEFT JOIN destination_buckets AS b ON b.destination = d.id
WHERE {limited} ORDER BY d.id;

-- name: flow_due_seqs
-- The oldest due intents (at ?1) of one destination ?2, up to ?3, as one JSON array of seqs, as due_seqs picks them.
SELECT json_group_array(seq) FROM (
    SELECT seq FROM intents AS due INDEXED BY intents_due
    WHERE status = 'pending' AND next_attempt_at <= ?1 AND due.destination = ?2
      AND {claimable}
    ORDER BY next_attempt_at LIMIT ?3);

-- name: unlimited_due_seqs
-- due_seqs (at ?1, up to ?2) of the destinations without a limit or a pause at ?1.
SELECT json_group_array(seq) FROM (
    SELECT seq FROM intents AS due INDEXED BY intents_due
    WHERE status = 'pending' AND next_attempt_at <= ?1
      AND due.destination NOT IN (SELECT id FROM destinations WHERE {limited})
      AND {claimable}
    ORDER BY next_attempt_at LIMIT ?2);

-- name: in_flight
-- How many of a destination's intents are leased.
SELECT count(*) FROM intents INDEXED BY intents_lease WHERE status = 'leased' AND destination = ?;

-- name: put_bucket
-- A destination's token bucket as a claim left it.
INSERT INTO destination_buckets (destination, tokens, refilled_at) VALUES (?, ?, ?)
ON CONFLICT (destination) DO UPDATE SET tokens = excluded.tokens, refilled_at = excluded.refilled_at;

-- name: waiting_behind
-- The earliest intent in the way of a pending intent (its key) of an ordered destination, as due_seqs judges it.
SELECT earlier.*, {event_payload[earlier]} AS event_payload FROM intents AS due
JOIN destinations AS ordered ON ordered.id = due.destination AND ordered.ordering = 'key'
JOIN intents AS earlier INDEXED BY intents_ordering ON {in_the_way}
WHERE due.intent_key = ? AND due.status = 'pending'
ORDER BY earlier.seq LIMIT 1;

-- name: lease
-- Lease intents (a JSON array of seqs) to a worker, bumping each one's fence.
UPDATE intents SET status = 'leased', lease_owner = ?, lease_expires_at = ?, fence = fence + 1,
                   updated_at = ?
WHERE seq IN (SELECT value FROM json_each(?));

-- name: claimed_intents
-- Intents (a JSON array of seqs) as plain rows: read by name, with no JSON to build or parse per row.
SELECT *, {event_payload[intents]} AS event_payload FROM intents WHERE seq IN (SELECT value FROM json_each(?));

-- name: renew_lease
-- Heartbeat: extend a lease the worker still holds at this fence.
UPDATE intents SET lease_expires_at = ? WHERE intent_key = ? AND status = 'leased' AND fence = ?;

-- name: expired_leases
-- Leases that ran out (the sweeper's work).
SELECT *, {event_payload[intents]} AS event_payload FROM intents INDEXED BY intents_lease
WHERE status = 'leased' AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?;

-- name: in_flight_attempt
-- The attempt started under an intent's current fence and not finished.
SELECT * FROM attempts WHERE intent_seq = ? AND fence = ? AND finished_at IS NULL
ORDER BY number DESC LIMIT 1;

-- name: next_due_at
-- When the soonest pending intent not waiting behind another of its key falls due; with a time ?1, leaving out
-- those of limited or paused destinations due by then (a claim at ?1 held them back, and says when to look again).
SELECT next_attempt_at FROM intents AS due INDEXED BY intents_due
WHERE status = 'pending' AND {claimable}
  AND (?1 IS NULL OR next_attempt_at > ?1 OR due.destination NOT IN (SELECT id FROM destinations WHERE {limited}))
ORDER BY next_attempt_at LIMIT 1;

-- name: pause_destination
-- Send nothing to a destination until ?2 (a receiver's Retry-After), unless it is paused longer already.
UPDATE destinations SET paused_until = max(coalesce(paused_until, ?2), ?2) WHERE id = ?1;

-- name: prunable
-- Finished intents (delivered, cancelled) last changed before a time, oldest first.
SELECT seq, action_id FROM intents INDEXED BY intents_finished
WHERE status IN ('delivered', 'cancelled') AND updated_at < ? ORDER BY updated_at LIMIT ?;

-- name: delete_events
-- An intent's events (pruning).
DELETE FROM events WHERE intent_seq = ?;

-- name: delete_attempts
-- An intent's attempts (pruning).
DELETE FROM attempts WHERE intent_seq = ?;

-- name: delete_intent
-- An intent (pruning, after its attempts and events).
DELETE FROM intents WHERE seq = ?;

-- name: count_by_status
-- The backlog by status and channel (metrics).
SELECT status, channel, count(*) FROM intents GROUP BY status, channel;

-- name: oldest_due
-- When the oldest due intent fell due (metrics: how far behind delivery is).
SELECT min(next_attempt_at) FROM intents INDEXED BY intents_due WHERE status = 'pending' AND next_attempt_at <= ?;

-- name: put_attempts
-- Record an attempt, or its outcome once known (run once per row: a row's values in column order, the last the JSON
-- array of the events the write keeps in the attempt, outbox/store/timeline.py): appended as one group, after the
-- intent's last events row. The groups are joined as text, the JSON not parsed again: ?16 is JSON our own code made.
INSERT INTO attempts (attempt_id, intent_seq, number, fence, worker, started_at, finished_at,
                      submission, outcome, status_code, reply, external_id, error, duration_ms, stage, events)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15,
        '[[' || coalesce((SELECT max(logged.id) FROM events AS logged WHERE logged.intent_seq = ?2), 0) || ','
             || ?16 || ']]')
ON CONFLICT (attempt_id) DO UPDATE SET
    finished_at = excluded.finished_at, submission = excluded.submission,
    outcome = excluded.outcome, status_code = excluded.status_code, reply = excluded.reply,
    external_id = excluded.external_id, error = excluded.error, duration_ms = excluded.duration_ms,
    stage = excluded.stage,
    events = CASE attempts.events WHEN '[]' THEN excluded.events  -- (an attempt started before its row kept events)
             ELSE substr(attempts.events, 1, length(attempts.events) - 1) || ',' || substr(excluded.events, 2) END;

-- name: insert_events
-- Append events from a JSON array of [intent_seq, kind, at, actor, reason, data] rows, in order.
INSERT INTO events (intent_seq, kind, at, actor, reason, data)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]')
FROM json_each(?);  -- json_each yields the rows in array order

-- name: first_submission
-- When an intent's first attempt that may have reached the receiver started.
SELECT min(started_at) FROM attempts
WHERE intent_seq = ? AND (submission IS NULL OR submission != 'not_submitted');

-- name: disable_destination
-- Stop sending to a destination (the receiver answered 410 Gone).
UPDATE destinations SET disabled = 1, updated_at = ? WHERE id = ?;

-- name: put_grant
-- Create or replace a grant, bumping its revision.
INSERT INTO grants (id, scope, destination, revision, expires_at, note, created_at, updated_at)
VALUES (?, ?, ?, 1, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET
    scope = excluded.scope, destination = excluded.destination, revision = grants.revision + 1,
    expires_at = excluded.expires_at, note = excluded.note, updated_at = excluded.updated_at
RETURNING *;

-- name: grant_by_id
-- One grant.
SELECT * FROM grants WHERE id = ?;

-- name: list_grants
-- Every grant, by id.
SELECT * FROM grants ORDER BY id;

-- name: delete_grant
-- Remove a grant.
DELETE FROM grants WHERE id = ?;

-- name: matching_grant
-- A live grant letting a scope reach a destination (exact destination first).
SELECT * FROM grants
WHERE scope = ? AND destination IN (?, '*') AND (expires_at IS NULL OR expires_at > ?)
ORDER BY destination = '*', revision DESC LIMIT 1;

-- name: list_intents
-- A page of intents, newest first, after a cursor.
SELECT *, {event_payload[intents]} AS event_payload FROM intents WHERE {where} ORDER BY seq DESC LIMIT ?;

-- name: update_targets
-- Where the intent of each of a set of changes (a JSON array of intent keys) stands: [position, seq, status, fence,
-- lease_expires_at, updated_at, lease_owner, unrecorded_lease] per key, seq null for an intent that does not exist.
SELECT json_group_array(json_array(u.key, i.seq, i.status, i.fence, i.lease_expires_at, i.updated_at, i.lease_owner,
                                   {unrecorded_lease[i]}))
FROM json_each(?) AS u LEFT JOIN intents AS i ON i.intent_key = u.value;

-- name: settle
-- Move settle: [seq, status, last_error, next_attempt_at, attempts, fence, updated_at] rows (null next_attempt_at,
-- attempts or fence: kept), the lease cleared.
UPDATE intents SET status = u.value ->> 1, last_error = u.value ->> 2,
                   next_attempt_at = coalesce(u.value ->> 3, next_attempt_at),
                   attempts = coalesce(u.value ->> 4, attempts), fence = coalesce(u.value ->> 5, fence),
                   lease_owner = NULL, lease_expires_at = NULL, updated_at = u.value ->> 6
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0;

-- name: release
-- Move release: [seq, next_attempt_at, updated_at] rows, pending again, the lease cleared.
UPDATE intents SET status = 'pending', next_attempt_at = u.value ->> 1, lease_owner = NULL, lease_expires_at = NULL,
                   updated_at = u.value ->> 2
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0;

-- name: hold
-- Move hold: [seq, last_error, updated_at] rows, held for approval, the lease cleared.
UPDATE intents SET status = 'held', last_error = u.value ->> 1, lease_owner = NULL, lease_expires_at = NULL,
                   updated_at = u.value ->> 2
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0;

-- name: replay
-- Move replay: [seq, next_attempt_at, max_attempts, updated_at] rows, pending again with no last error
-- and a retry schedule that starts over.
UPDATE intents SET status = 'pending', next_attempt_at = u.value ->> 1, max_attempts = u.value ->> 2,
                   last_error = NULL, updated_at = u.value ->> 3, replayed_after = attempts
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0
RETURNING *, {event_payload[intents]} AS event_payload;

-- name: resolve
-- Move resolve: [seq, status, next_attempt_at, max_attempts, updated_at] rows (null next_attempt_at or
-- max_attempts: kept; given, a retry schedule starts over).
UPDATE intents SET status = u.value ->> 1, next_attempt_at = coalesce(u.value ->> 2, next_attempt_at),
                   max_attempts = coalesce(u.value ->> 3, max_attempts), updated_at = u.value ->> 4,
                   replayed_after = CASE WHEN u.value ->> 3 IS NULL THEN replayed_after ELSE attempts END
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0
RETURNING *, {event_payload[intents]} AS event_payload;

-- name: cancel
-- Move cancel: [seq, updated_at] rows, withdrawn.
UPDATE intents SET status = 'cancelled', updated_at = u.value ->> 1
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0
RETURNING *, {event_payload[intents]} AS event_payload;

-- name: approve
-- Move approve: [seq, approved_digest, approval_expires_at, approved_by, next_attempt_at, updated_at] rows, pending.
UPDATE intents SET status = 'pending', approved_digest = u.value ->> 1, approval_expires_at = u.value ->> 2,
                   approved_by = u.value ->> 3, next_attempt_at = u.value ->> 4, updated_at = u.value ->> 5
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0
RETURNING *, {event_payload[intents]} AS event_payload;

-- name: reject
-- Move reject: [seq, updated_at] rows, cancelled unsent.
UPDATE intents SET status = 'cancelled', updated_at = u.value ->> 1
FROM json_each(?) AS u WHERE intents.seq = u.value ->> 0
RETURNING *, {event_payload[intents]} AS event_payload;

-- name: recoverable
-- Move recover's intents: up to ?2 leases that ran out by ?1 with no attempt in flight (started under the
-- current fence, unfinished), as one JSON array of [seq, lease_owner, updated_at, fence, unrecorded_lease].
SELECT json_group_array(json_array(seq, lease_owner, updated_at, fence, unrecorded)) FROM (
    SELECT seq, lease_owner, updated_at, fence, {unrecorded_lease[i]} AS unrecorded
    FROM intents AS i INDEXED BY intents_lease
    WHERE status = 'leased' AND lease_expires_at <= ?1
      AND NOT EXISTS (SELECT 1 FROM attempts AS a
                      WHERE a.intent_seq = i.seq AND a.fence = i.fence AND a.finished_at IS NULL)
    ORDER BY lease_expires_at LIMIT ?2);

-- name: recover
-- Move recover: the intents (a JSON array of [seq, ...]) pending again and due at ?1, their fence raised past the
-- lost holder's, the lease cleared.
UPDATE intents SET status = 'pending', next_attempt_at = ?1, fence = fence + 1, lease_owner = NULL,
                   lease_expires_at = NULL, updated_at = ?1
WHERE seq IN (SELECT value ->> 0 FROM json_each(?2));

-- name: intent_by_seq
-- One intent by its seq.
SELECT *, {event_payload[intents]} AS event_payload FROM intents WHERE seq = ?;

-- name: put_destination
-- Register or replace a destination.
INSERT INTO destinations (id, channel, settings, secrets, idempotent, retention_seconds, on_unknown,
                          timeout_seconds, requires_approval, allow_private_network, disabled,
                          created_at, updated_at, reconcile, ordering, ordering_on_dead,
                          retry_schedule, max_age_seconds, subscriptions, rate_per_second,
                          rate_burst, max_in_flight, owner, previous_secrets_until)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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
RETURNING *;

-- name: sealing_key
-- The id of the key destination secrets are sealed under (no row: nothing sealed yet).
SELECT key_id FROM secrets_key;

-- name: propose_sealing_key
-- Name the key to seal under, unless one is named already (read it back with sealing_key).
INSERT INTO secrets_key (only_row, key_id) VALUES (1, ?) ON CONFLICT (only_row) DO NOTHING;

-- name: set_sealing_key
-- Name the key to seal under, in the transaction that sealed every destination's secrets under it.
UPDATE secrets_key SET key_id = ?;

-- name: destination_secrets
-- Every destination's stored secrets, by id (to seal them again).
SELECT id, secrets FROM destinations ORDER BY id;

-- name: put_destination_secrets
-- Replace one destination's stored secrets (sealed again).
UPDATE destinations SET secrets = ? WHERE id = ?;

-- name: destination_by_id
-- One destination.
SELECT * FROM destinations WHERE id = ?;

-- name: list_destinations
-- Every destination, by id.
SELECT * FROM destinations ORDER BY id;

-- name: owned_destinations
-- The destinations one scope owns, by id.
SELECT * FROM destinations WHERE owner = ?1 ORDER BY id;

-- name: owned_counts
-- How many destinations scope ?1 owns besides ?2, and how many subscriptions those hold.
SELECT (SELECT count(*) FROM destinations WHERE owner = ?1 AND id <> ?2) AS destinations,
       (SELECT count(*) FROM subscriptions AS s JOIN destinations AS d ON d.id = s.destination
        WHERE d.owner = ?1 AND d.id <> ?2) AS subscriptions;

-- name: open_intents_for_destination
-- How many intents still wait on a destination (it may not be deleted under them).
SELECT count(*) FROM intents WHERE destination = ? AND status IN ('pending', 'leased', 'held', 'unknown');

-- name: any_intent_for_destination
-- Whether any intent, even finished, names the destination (its history keeps the reference).
SELECT 1 FROM intents WHERE destination = ? LIMIT 1;

-- name: grants_for_destination
-- The grants that name a destination (it may not be deleted under them).
SELECT id FROM grants WHERE destination = ? ORDER BY id;

-- name: delete_destination
-- Remove a destination.
DELETE FROM destinations WHERE id = ?;

-- name: insert_token
-- Store a new token's hash.
INSERT INTO tokens (id, hash, role, scopes, label, created_at) VALUES (?, ?, ?, ?, ?, ?);

-- name: token_by_hash
-- The token a bearer presents, if it is not revoked.
SELECT * FROM tokens WHERE hash = ? AND revoked_at IS NULL;

-- name: list_tokens
-- Every token, oldest first.
SELECT * FROM tokens ORDER BY created_at, id;

-- name: revoke_token
-- Revoke token ?2 at ?1 (with ?3, unless it is the last active admin token: checked in this one
-- statement, so two revocations cannot both pass); returns it, or nothing.
UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL
  AND (NOT ?3 OR role <> 'admin' OR EXISTS (
    SELECT 1 FROM tokens other WHERE other.role = 'admin' AND other.revoked_at IS NULL AND other.id <> ?2))
RETURNING *;

-- name: token_by_id
-- A token by its id, revoked or not.
SELECT * FROM tokens WHERE id = ?;

-- name: count_active_tokens
-- Active tokens of a role.
SELECT count(*) FROM tokens WHERE role = ? AND revoked_at IS NULL;

-- name: prune_console_sessions
-- Drop the console sessions expired at ?1, and those opened with a token since revoked.
DELETE FROM console_sessions
WHERE expires_at <= ?1 OR token_id IN (SELECT id FROM tokens WHERE revoked_at IS NOT NULL);

-- name: insert_console_session
-- Store a new console session (the hash of its id).
INSERT INTO console_sessions (id_hash, token_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4);

-- name: trim_console_sessions
-- Keep token ?1's newest ?2 console sessions, dropping the older ones.
DELETE FROM console_sessions WHERE token_id = ?1 AND id_hash NOT IN (
  SELECT id_hash FROM console_sessions WHERE token_id = ?1 ORDER BY created_at DESC, id_hash DESC LIMIT ?2);

-- name: console_session
-- The token of console session ?1, if the session is unexpired at ?2 and the token not revoked.
SELECT t.* FROM console_sessions s JOIN tokens t ON t.id = s.token_id
WHERE s.id_hash = ?1 AND s.expires_at > ?2 AND t.revoked_at IS NULL;

-- name: close_console_session
-- Remove a console session (signing out).
DELETE FROM console_sessions WHERE id_hash = ?1;

-- name: prune_portal_links
-- Drop the portal links unopened past their expiry at ?1, the sessions ended by ?1, and those of revoked tokens.
DELETE FROM portal_links
WHERE (session_hash IS NULL AND expires_at <= ?1) OR session_expires_at <= ?1
   OR token_id IN (SELECT id FROM tokens WHERE revoked_at IS NOT NULL);

-- name: insert_portal_link
-- Store a new portal link (the hash of its token).
INSERT INTO portal_links (link_hash, token_id, scope, read_only, session_seconds, created_at, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7);

-- name: open_portal_link
-- Open link ?1 once, at ?3, for session ?2, if it is unopened, unexpired and its token not revoked: its scope,
-- read-only flag and the session's end (no row: expired, opened already, revoked or none).
UPDATE portal_links SET session_hash = ?2, session_expires_at = ?3 + session_seconds * 1000000
WHERE link_hash = ?1 AND session_hash IS NULL AND expires_at > ?3
  AND EXISTS (SELECT 1 FROM tokens t WHERE t.id = portal_links.token_id AND t.revoked_at IS NULL)
RETURNING scope, read_only, session_expires_at;

-- name: portal_session
-- The scope, read-only flag and end of portal session ?1, if it is unexpired at ?2 and its link's token not revoked.
SELECT l.scope, l.read_only, l.session_expires_at FROM portal_links l JOIN tokens t ON t.id = l.token_id
WHERE l.session_hash = ?1 AND l.session_expires_at > ?2 AND t.revoked_at IS NULL;

-- name: close_portal_session
-- Remove portal session ?1 with its link (signing out): the link cannot open again, being gone.
DELETE FROM portal_links WHERE session_hash = ?1;

-- name: activity_minutes
-- Attempts started since ?1 and finished, per destination, minute of their finish (microseconds)
-- and outcome: count, summed duration, last end.
SELECT i.destination, a.finished_at / 60000000 * 60000000 AS minute, a.outcome, count(*),
       coalesce(sum(a.duration_ms), 0), max(a.finished_at)
FROM attempts a INDEXED BY attempts_started JOIN intents i ON i.seq = a.intent_seq
WHERE a.started_at >= ?1 AND a.finished_at IS NOT NULL GROUP BY i.destination, minute, a.outcome;

-- name: activity_failures
-- Each destination's latest failed attempt of those started since ?1 (SQLite takes the bare columns
-- from the max row).
SELECT i.destination, max(a.finished_at), a.outcome, a.status_code, a.error
FROM attempts a INDEXED BY attempts_started JOIN intents i ON i.seq = a.intent_seq
WHERE a.started_at >= ?1 AND a.outcome <> 'delivered' GROUP BY i.destination;

-- name: destination_counts
-- A destination's intents by status (through its index).
SELECT status, count(*) FROM intents WHERE destination = ? GROUP BY status;

-- name: destination_failures
-- A destination's failed attempts of those started since ?2, newest first, at most ?3.
SELECT i.action_id, i.scope, a.number, a.finished_at, a.submission, a.outcome, a.status_code, a.error
FROM attempts a INDEXED BY attempts_started JOIN intents i ON i.seq = a.intent_seq
WHERE i.destination = ?1 AND a.started_at >= ?2 AND a.outcome <> 'delivered'
ORDER BY a.finished_at DESC, a.attempt_id DESC LIMIT ?3;

-- name: activity_waiting
-- Each destination's open intents and when its oldest due one (at ?1) fell due.
SELECT destination, count(*), min(CASE WHEN status = 'pending' AND next_attempt_at <= ?1 THEN next_attempt_at END)
FROM intents WHERE status IN ('pending', 'leased', 'held') GROUP BY destination;

-- name: activity_backlog
-- Open intents by the minute they were enqueued (at least ?1's), and intents settled since ?1 by the minutes
-- they were enqueued and last changed.
SELECT max(created_at, ?1) / 60000000 * 60000000 AS since, NULL, count(*)
FROM intents WHERE status IN ('pending', 'leased', 'held') GROUP BY since
UNION ALL
SELECT max(created_at, ?1) / 60000000 * 60000000 AS since, updated_at / 60000000 * 60000000 AS until, count(*)
FROM intents INDEXED BY intents_finished WHERE status IN ('delivered', 'cancelled') AND updated_at >= ?1
GROUP BY since, until
UNION ALL
SELECT max(created_at, ?1) / 60000000 * 60000000 AS since, updated_at / 60000000 * 60000000 AS until, count(*)
FROM intents WHERE status IN ('dead', 'unknown', 'revoked') AND updated_at >= ?1 GROUP BY since, until;

-- name: delete_subscriptions
-- A destination's subscription rows (replaced with it, or removed before it).
DELETE FROM subscriptions WHERE destination = ?;

-- name: insert_subscriptions
-- A destination's subscription rows, from a JSON array of [destination, prefix, exact, scope] rows.
INSERT INTO subscriptions (destination, prefix, exact, scope)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(?);

-- name: insert_topic_events
-- Record the events of a JSON array of rows (as insert_topic_event takes one), in order, each unless its key exists
-- (an earlier row's included); returns the key and seq of each one recorded.
INSERT INTO topic_events (event_key, event_id, scope, topic, payload, payload_digest, ordering_key, actor, created_at)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7,
       value ->> 8
FROM json_each(?) WHERE true  -- (WHERE: so that ON CONFLICT is not read as a join's ON)
ON CONFLICT (event_key) DO NOTHING
RETURNING event_key, seq;

-- name: event_subscribers
-- The destinations subscribed to topic ?2 for scope ?1 (with ?4, only those the scope holds a grant for that is live
-- at ?3, as matching_grant judges; an owned one only for its owner, whose grant it implies), by id, with what an
-- enqueue needs to know of each.
SELECT d.id, d.channel, d.requires_approval, d.owner FROM destinations d
WHERE EXISTS (SELECT 1 FROM subscriptions s
              WHERE s.destination = d.id AND (s.scope IS NULL OR s.scope = ?1)
                AND CASE WHEN s.exact THEN s.prefix = ?2 ELSE substr(?2, 1, length(s.prefix)) = s.prefix END)
  AND CASE WHEN d.owner IS NOT NULL THEN d.owner = ?1
           ELSE NOT ?4 OR EXISTS (SELECT 1 FROM grants g
                                  WHERE g.scope = ?1 AND g.destination IN (d.id, '*')
                                    AND (g.expires_at IS NULL OR g.expires_at > ?3)) END
ORDER BY d.id;

-- name: events_subscribers
-- event_subscribers for a JSON array of [n, scope, topic, time] events at once, with ?2 as its ?4: the destinations
-- subscribed, as (n, id, channel, requires_approval, owner), by n then id.
SELECT e.value ->> 0 AS n, d.id, d.channel, d.requires_approval, d.owner
FROM json_each(?1) AS e JOIN destinations d ON EXISTS (
    SELECT 1 FROM subscriptions s
    WHERE s.destination = d.id AND (s.scope IS NULL OR s.scope = e.value ->> 1)
      AND CASE WHEN s.exact THEN s.prefix = e.value ->> 2
               ELSE substr(e.value ->> 2, 1, length(s.prefix)) = s.prefix END)
WHERE CASE WHEN d.owner IS NOT NULL THEN d.owner = e.value ->> 1
           ELSE NOT ?2 OR EXISTS (SELECT 1 FROM grants g
                                  WHERE g.scope = e.value ->> 1 AND g.destination IN (d.id, '*')
                                    AND (g.expires_at IS NULL OR g.expires_at > e.value ->> 3)) END
ORDER BY 1, d.id;

-- name: insert_topic_event
-- Record an event unless its key (scope/event_id) exists; returns the new seq, or nothing.
INSERT INTO topic_events (event_key, event_id, scope, topic, payload, payload_digest, ordering_key, actor, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (event_key) DO NOTHING
RETURNING seq;

-- name: set_event_skipped
-- The subscribers an event made no intent for, as JSON [[destination, reason], ...].
UPDATE topic_events SET skipped = ? WHERE seq = ?;

-- name: event_by_key
-- One event by its key (scope/event_id).
SELECT * FROM topic_events WHERE event_key = ?;

-- name: events_by_id
-- The events of every scope that use an event id (at most one per scope).
SELECT * FROM topic_events WHERE event_id = ? ORDER BY scope;

-- name: intents_of_events
-- The intents of a JSON array of [scope, event_id] events.
SELECT *, {event_payload[intents]} AS event_payload FROM intents
WHERE event_id IS NOT NULL AND (scope, event_id) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?))
ORDER BY destination;

-- name: list_events
-- A page of events, newest first, after a cursor.
SELECT * FROM topic_events WHERE {where} ORDER BY seq DESC LIMIT ?;
