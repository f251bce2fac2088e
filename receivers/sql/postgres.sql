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

-- name: lock_many
-- Several records, locked in identity order (concurrent batches never deadlock) for the rest of the transaction.
SELECT * FROM {table} WHERE identity = ANY($1::text[]) ORDER BY identity FOR UPDATE;

-- name: placeholders
-- An absent record (read as no record at all) for each identity without one, so a batch of claims can lock every row it decides on.
INSERT INTO {table} (identity, state, epoch, min_fence, expires_at)
SELECT identity, 'absent', 0, 0, $2 FROM unnest($1::text[]) AS identity ORDER BY identity
ON CONFLICT (identity) DO NOTHING;
