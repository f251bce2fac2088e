-- A lease lives in a narrow row of its own, apart from the intent's record: the claim locks the intent's row and
-- inserts the lease without writing the intent, the heartbeat renews the lease row only, and the move that ends the
-- lease (settle, release, hold, recover) writes the intent's row once and deletes the lease in the same statement.
-- While a lease row exists the intent's stored status is 'pending', its stored fence the one before the lease's
-- (the lease's is always one more) and its stored updated_at the time it was last written; the record shows the
-- lease (intent_records, below), and nothing reads a status, fence or lease from intents without it.
-- The primary key is the lease row's only index, and its pages keep room so that a renewal is a HOT update.
-- (No foreign key to intents: its check would read and lock the intent's row once more per claim, which the claim
-- holds locked already; a leased intent is never pruned.)
CREATE TABLE intent_leases (
    intent_seq       bigint PRIMARY KEY,
    destination      text NOT NULL,          -- the intent's: what a destination has in flight (max_in_flight)
    lease_owner      text NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    fence            bigint NOT NULL,
    leased_at        timestamptz NOT NULL
) WITH (fillfactor = 50);
-- The leases held as this runs become lease rows; their intents' rows are stored as an unleased intent is.
INSERT INTO intent_leases (intent_seq, destination, lease_owner, lease_expires_at, fence, leased_at)
SELECT seq, destination, coalesce(lease_owner, ''), coalesce(lease_expires_at, updated_at), fence, updated_at
FROM intents WHERE status = 'leased';
UPDATE intents SET status = 'pending', fence = fence - 1 WHERE status = 'leased';
-- The flow-limited claim returns records (intent_records[]): the store makes it again as migrations end.
DROP FUNCTION IF EXISTS outbox_claim_limited(text, timestamptz, timestamptz, integer);
DROP INDEX intents_lease;  -- the sweeper reads expired leases from intent_leases
ALTER TABLE intents DROP COLUMN lease_owner, DROP COLUMN lease_expires_at;
-- An intent as every reader shows it: its row, with its lease where one is held (status 'leased', the lease's
-- owner, expiry and fence, and updated_at the time it was leased). Last, stored_status, the row's own, which a listing
-- by status names beside status so that intents_status finds its rows (postgres.sql's status_in); no record reads it.
CREATE VIEW intent_records AS
SELECT i.seq, i.intent_key, i.scope, i.destination, i.channel, i.payload, i.payload_digest,
       CASE WHEN l.intent_seq IS NULL THEN i.status ELSE 'leased' END AS status,
       i.attempts, i.max_attempts, i.next_attempt_at, i.not_before, i.expires_at,
       l.lease_owner, l.lease_expires_at, coalesce(l.fence, i.fence) AS fence, i.created_at,
       coalesce(l.leased_at, i.updated_at) AS updated_at, i.last_error, i.approved_digest, i.approval_expires_at,
       i.approved_by, i.action_id, i.ordering_key, i.event_id, i.replayed_after, i.trace_context, i.payload_event,
       i.status AS stored_status
FROM intents AS i LEFT JOIN intent_leases AS l ON l.intent_seq = i.seq;
