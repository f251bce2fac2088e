-- What the sender needs: built-in authority grants, and a fast lookup of in-flight attempts.

CREATE TABLE grants (
    id          text PRIMARY KEY,
    scope       text NOT NULL,
    destination text NOT NULL,                  -- a destination id, or '*' for every one
    revision    integer NOT NULL,               -- bumped on each change, recorded with decisions
    expires_at  timestamptz,
    note        text,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE INDEX grants_scope ON grants (scope, destination);

CREATE INDEX attempts_in_flight ON attempts (intent_seq, fence) WHERE finished_at IS NULL;
