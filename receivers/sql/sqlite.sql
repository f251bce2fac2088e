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
-- Several records, named by a JSON array of identities (one statement for a whole batch).
SELECT * FROM {table} WHERE identity IN (SELECT value FROM json_each(?));
