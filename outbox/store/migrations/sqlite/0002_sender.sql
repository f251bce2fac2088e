-- What the sender needs: built-in authority grants, and a fast lookup of in-flight attempts.

CREATE TABLE grants (
    id          TEXT PRIMARY KEY,
    scope       TEXT NOT NULL,
    destination TEXT NOT NULL,                  -- a destination id, or '*' for every one
    revision    INTEGER NOT NULL,               -- bumped on each change, recorded with decisions
    expires_at  INTEGER,
    note        TEXT,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX grants_scope ON grants (scope, destination);

CREATE INDEX attempts_in_flight ON attempts (intent_seq, fence) WHERE finished_at IS NULL;
