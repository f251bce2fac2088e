-- Idempotency records in PostgreSQL. Each statement is a named block: "-- name: NAME" then its purpose.
-- {table} is the configured table name (checked to be an identifier).

-- name: create
-- The records table and its purge index.
CREATE TABLE IF NOT EXISTS {table} (
    identity         text PRIMARY KEY,
    fingerprint      text,
    state            text NOT NULL,
    epoch            bigint NOT NULL,
    min_fence        bigint NOT NULL,
    lease_expires_at timestamptz,
    expires_at       timestamptz NOT NULL,
    status           integer,
    headers          text,
    body             bytea,
    body_stored      boolean NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS {table}_expiry ON {table} (expires_at);

-- name: lock
-- One record, locked for the rest of the transaction.
SELECT * FROM {table} WHERE identity = $1 FOR UPDATE;

-- name: get
-- One record.
SELECT * FROM {table} WHERE identity = $1;

-- name: insert
-- Create a record unless a concurrent request just did; returns the identity when created.
INSERT INTO {table} (identity, fingerprint, state, epoch, min_fence, lease_expires_at, expires_at,
                     status, headers, body, body_stored)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (identity) DO NOTHING
RETURNING identity;

-- name: update
-- Write a locked record as decided.
UPDATE {table} SET fingerprint = $2, state = $3, epoch = $4, min_fence = $5, lease_expires_at = $6,
                   expires_at = $7, status = $8, headers = $9, body = $10, body_stored = $11
WHERE identity = $1;

-- name: purge
-- Delete records whose retention ran out.
DELETE FROM {table} WHERE expires_at <= $1;

-- name: get_many
-- Several records, named by an array of identities (the refusals of a batch claim, locked by it).
SELECT * FROM {table} WHERE identity = ANY($1::text[]);

-- name: claim_many
-- Claim a batch of distinct identities ($1 identities, $2 fingerprints, $3 fences, null for none) by decide_claim's rules, in identity order (concurrent batches never deadlock); returns each claimed identity with its new epoch. A refused row is locked, not written.
INSERT INTO {table} AS t (identity, fingerprint, state, epoch, min_fence, lease_expires_at, expires_at)
SELECT r.identity, r.fingerprint, 'in_progress', 1, coalesce(r.fence, 0), $5, $6
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r (identity, fingerprint, fence)
ORDER BY r.identity
ON CONFLICT (identity) DO UPDATE
SET fingerprint = excluded.fingerprint, state = 'in_progress', epoch = t.epoch + 1,
    min_fence = greatest(excluded.min_fence, CASE WHEN t.expires_at > $4 THEN t.min_fence ELSE 0 END),
    lease_expires_at = excluded.lease_expires_at, expires_at = excluded.expires_at,
    status = NULL, headers = NULL, body = NULL, body_stored = false
WHERE (t.expires_at <= $4 OR t.state = 'absent'
       OR (t.state = 'in_progress' AND t.fingerprint = excluded.fingerprint AND t.lease_expires_at <= $4))
  AND (excluded.min_fence >= CASE WHEN t.expires_at > $4 THEN t.min_fence ELSE 0 END
       OR excluded.identity = ANY($7::text[]))
RETURNING t.identity, t.epoch;

-- name: complete_many
-- Complete a batch of distinct identities still held by the given epochs ($1 identities, $2 epochs, $3 statuses, $4 one JSON array of each row's header pairs, encoded once per batch rather than per row, $5 bodies, null when not stored); returns the identities completed.
UPDATE {table} AS t
SET state = 'completed', lease_expires_at = NULL, expires_at = $6, status = d.status, headers = h.pairs::text,
    body = d.body, body_stored = d.body IS NOT NULL
FROM unnest($1::text[], $2::bigint[], $3::integer[], $5::bytea[]) WITH ORDINALITY AS d (identity, epoch, status, body, n)
JOIN json_array_elements($4::json) WITH ORDINALITY AS h (pairs, n) USING (n)
WHERE t.identity = d.identity AND t.state = 'in_progress' AND t.epoch = d.epoch
RETURNING t.identity;

-- name: release_many
-- Release a batch of distinct identities still held by the given epochs ($1 identities, $2 epochs); returns the identities released.
UPDATE {table} AS t
SET state = 'absent', fingerprint = NULL, lease_expires_at = NULL, status = NULL, headers = NULL, body = NULL,
    body_stored = false
FROM unnest($1::text[], $2::bigint[]) AS d (identity, epoch)
WHERE t.identity = d.identity AND t.state = 'in_progress' AND t.epoch = d.epoch
RETURNING t.identity;
