-- Intents, their attempts and events, destinations and API tokens.
-- Times are integer microseconds since the Unix epoch, UTC.

CREATE TABLE destinations (
    id                    TEXT PRIMARY KEY,
    channel               TEXT NOT NULL,
    url                   TEXT NOT NULL,
    secrets               TEXT NOT NULL,          -- JSON list, newest first; never returned
    idempotent            INTEGER NOT NULL,
    retention_seconds     INTEGER NOT NULL,
    on_unknown            TEXT NOT NULL,
    timeout_seconds       REAL NOT NULL,
    requires_approval     INTEGER NOT NULL,
    allow_private_network INTEGER NOT NULL,
    disabled              INTEGER NOT NULL,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL
) STRICT;

CREATE TABLE intents (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    action_id        TEXT NOT NULL UNIQUE,
    scope            TEXT NOT NULL,
    destination      TEXT NOT NULL REFERENCES destinations(id),
    channel          TEXT NOT NULL,
    payload          TEXT NOT NULL,                -- RFC 8785 canonical JSON
    payload_digest   TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    next_attempt_at  INTEGER NOT NULL,
    not_before       INTEGER,
    expires_at       INTEGER,
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    fence            INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    last_error       TEXT
) STRICT;

-- "Next due intent" and "expired leases" stay index seeks however many rows are done.
CREATE INDEX intents_due ON intents (next_attempt_at) WHERE status = 'pending';
CREATE INDEX intents_lease ON intents (lease_expires_at) WHERE status = 'leased';
-- Listing newest first, filtered by the usual operator questions.
CREATE INDEX intents_status ON intents (status, seq);
CREATE INDEX intents_scope ON intents (scope, seq);
CREATE INDEX intents_destination ON intents (destination, seq);

CREATE TABLE attempts (
    attempt_id   TEXT PRIMARY KEY,
    intent_seq   INTEGER NOT NULL REFERENCES intents(seq),
    number       INTEGER NOT NULL,
    fence        INTEGER NOT NULL,
    worker       TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    submission   TEXT,
    outcome      TEXT,
    status_code  INTEGER,
    reply        TEXT,
    external_id  TEXT,
    error        TEXT,
    duration_ms  REAL
) STRICT;
CREATE INDEX attempts_intent ON attempts (intent_seq, number);

CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    intent_seq INTEGER NOT NULL REFERENCES intents(seq),
    kind       TEXT NOT NULL,
    at         INTEGER NOT NULL,
    actor      TEXT NOT NULL,
    reason     TEXT,
    data       TEXT NOT NULL DEFAULT '{}'
) STRICT;
CREATE INDEX events_intent ON events (intent_seq, id);

CREATE TABLE tokens (
    id         TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    role       TEXT NOT NULL,
    scopes     TEXT NOT NULL,                       -- JSON list
    label      TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
) STRICT;
