-- Idempotency records in SQLite. Each statement is a named block: "-- name: NAME" then its purpose.
-- {table} is the configured table name (checked to be an identifier).

-- name: create
-- The records table and its purge index.
CREATE TABLE IF NOT EXISTS {table} (
    identity         TEXT PRIMARY KEY,
    fingerprint      TEXT,
    state            TEXT NOT NULL,
    epoch            INTEGER NOT NULL,
    min_fence        INTEGER NOT NULL,
    lease_expires_at INTEGER,
    expires_at       INTEGER NOT NULL,
    status           INTEGER,
    headers          TEXT,
    body             BLOB,
    body_stored      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {table}_expiry ON {table} (expires_at);

-- name: get
-- One record.
SELECT * FROM {table} WHERE identity = ?;

-- name: put
-- Write a record as decided.
INSERT OR REPLACE INTO {table} (identity, fingerprint, state, epoch, min_fence, lease_expires_at,
                                expires_at, status, headers, body, body_stored)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: purge
-- Delete up to a number of records whose retention ran out (a batch: claims wait behind it).
DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE expires_at <= ? LIMIT ?);

-- name: get_many
-- Several records, named by a JSON array of identities (the refusals of a batch claim).
SELECT * FROM {table} WHERE identity IN (SELECT value FROM json_each(?));

-- name: claim_many
-- Claim a batch of distinct identities (:requests, a JSON array of [identity, fingerprint, fence or null]; :unfenced, those without a fence) by decide_claim's rules; returns each claimed identity with its new epoch.
INSERT INTO {table} (identity, fingerprint, state, epoch, min_fence, lease_expires_at, expires_at)
SELECT r.value ->> 0, r.value ->> 1, 'in_progress', 1, coalesce(r.value ->> 2, 0), :lease_until, :expires_at
FROM json_each(:requests) AS r WHERE true
ON CONFLICT (identity) DO UPDATE
SET fingerprint = excluded.fingerprint, state = 'in_progress', epoch = epoch + 1,
    min_fence = max(excluded.min_fence, CASE WHEN expires_at > :now THEN min_fence ELSE 0 END),
    lease_expires_at = excluded.lease_expires_at, expires_at = excluded.expires_at,
    status = NULL, headers = NULL, body = NULL, body_stored = 0
WHERE (expires_at <= :now OR state = 'absent'
       OR (state = 'in_progress' AND fingerprint = excluded.fingerprint AND lease_expires_at <= :now))
  AND (excluded.min_fence >= CASE WHEN expires_at > :now THEN min_fence ELSE 0 END
       OR excluded.identity IN (SELECT value FROM json_each(:unfenced)))
RETURNING identity, epoch;

-- name: complete_many
-- Complete a batch of distinct identities still held by the given epochs (:done, a JSON array of [identity, epoch, status, headers, body as hex or null when not stored]; an empty body is spelled in SQL, since a call into Python per row waits for the interpreter each time); returns the identities completed.
UPDATE {table}
SET state = 'completed', lease_expires_at = NULL, expires_at = :expires_at, status = d.value ->> 2,
    headers = d.value -> 3, body_stored = d.value ->> 4 IS NOT NULL,
    body = CASE WHEN d.value ->> 4 = '' THEN x'' ELSE unhex_blob(d.value ->> 4) END
FROM json_each(:done) AS d
WHERE {table}.identity = d.value ->> 0 AND {table}.state = 'in_progress' AND {table}.epoch = d.value ->> 1
RETURNING {table}.identity;

-- name: release_many
-- Release a batch of distinct identities still held by the given epochs (a JSON array of [identity, epoch]); returns the identities released.
UPDATE {table}
SET state = 'absent', fingerprint = NULL, lease_expires_at = NULL, status = NULL, headers = NULL, body = NULL,
    body_stored = 0
FROM json_each(?) AS d
WHERE {table}.identity = d.value ->> 0 AND {table}.state = 'in_progress' AND {table}.epoch = d.value ->> 1
RETURNING {table}.identity;
