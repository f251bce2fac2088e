-- Intents, their attempts and events, destinations and API tokens, in PostgreSQL.
--
-- The PostgreSQL scripts mirror SQLite's version by version: each makes the change SQLite's
-- script of the same number makes, so a version names one schema in both dialects,
-- schema_migrations reads the same in both, and a later change is one script per dialect under
-- one number.
-- Times are timestamptz (microseconds, as SQLite's integers); JSON is jsonb, except the payload,
-- kept as the exact canonical text its digest is of.

CREATE TABLE destinations (
    id                    text PRIMARY KEY,
    channel               text NOT NULL,
    url                   text NOT NULL,
    secrets               jsonb NOT NULL,          -- list, newest first; never returned
    idempotent            boolean NOT NULL,
    retention_seconds     bigint NOT NULL,
    on_unknown            text NOT NULL,
    timeout_seconds       double precision NOT NULL,
    requires_approval     boolean NOT NULL,
    allow_private_network boolean NOT NULL,
    disabled              boolean NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL
);

CREATE TABLE intents (
    seq              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id        text NOT NULL UNIQUE,
    scope            text NOT NULL,
    destination      text NOT NULL REFERENCES destinations(id),
    channel          text NOT NULL,
    payload          text NOT NULL,                -- RFC 8785 canonical JSON
    payload_digest   text NOT NULL,
    status           text NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL,
    next_attempt_at  timestamptz NOT NULL,
    not_before       timestamptz,
    expires_at       timestamptz,
    lease_owner      text,
    lease_expires_at timestamptz,
    fence            bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    last_error       text
);

-- "Next due intent" and "expired leases" stay index seeks however many rows are done.
CREATE INDEX intents_due ON intents (next_attempt_at) WHERE status = 'pending';
CREATE INDEX intents_lease ON intents (lease_expires_at) WHERE status = 'leased';
-- Listing newest first, filtered by the usual operator questions.
CREATE INDEX intents_status ON intents (status, seq);
CREATE INDEX intents_scope ON intents (scope, seq);
CREATE INDEX intents_destination ON intents (destination, seq);

CREATE TABLE attempts (
    attempt_id   text PRIMARY KEY,
    intent_seq   bigint NOT NULL REFERENCES intents(seq),
    number       integer NOT NULL,
    fence        bigint NOT NULL,
    worker       text NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    submission   text,
    outcome      text,
    status_code  integer,
    reply        text,
    external_id  text,
    error        text,
    duration_ms  double precision
);
CREATE INDEX attempts_intent ON attempts (intent_seq, number);

CREATE TABLE events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent_seq bigint NOT NULL REFERENCES intents(seq),
    kind       text NOT NULL,
    at         timestamptz NOT NULL,
    actor      text NOT NULL,
    reason     text,
    data       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX events_intent ON events (intent_seq, id);

CREATE TABLE tokens (
    id         text PRIMARY KEY,
    hash       text NOT NULL UNIQUE,
    role       text NOT NULL,
    scopes     jsonb NOT NULL,                      -- list
    label      text,
    created_at timestamptz NOT NULL,
    revoked_at timestamptz
);
