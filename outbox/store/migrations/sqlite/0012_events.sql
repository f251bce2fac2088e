-- Events and subscriptions: a destination subscribes to topics (kept as given, for the API, and
-- as the rows a fan-out matches with one join); an event is recorded once per scope/event_id, in
-- the commit that makes its intents, each of which names it (event_id, in the event's scope).
-- Times are integer microseconds since the Unix epoch, UTC.
ALTER TABLE destinations ADD COLUMN subscriptions TEXT NOT NULL DEFAULT '[]';

CREATE TABLE subscriptions (
    destination TEXT NOT NULL REFERENCES destinations(id),
    prefix      TEXT NOT NULL,      -- the whole topic when exact, else what a matching topic starts with
    exact       INTEGER NOT NULL,
    scope       TEXT                -- NULL: every scope (that holds a grant for the destination)
) STRICT;
CREATE INDEX subscriptions_destination ON subscriptions (destination);

CREATE TABLE topic_events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_key      TEXT NOT NULL UNIQUE,           -- scope/event_id
    event_id       TEXT NOT NULL,
    scope          TEXT NOT NULL,
    topic          TEXT NOT NULL,
    payload        TEXT NOT NULL,                  -- RFC 8785 canonical JSON
    payload_digest TEXT NOT NULL,
    ordering_key   TEXT,
    skipped        TEXT NOT NULL DEFAULT '[]',     -- JSON [[destination, reason], ...]: no intent made
    actor          TEXT NOT NULL,
    created_at     INTEGER NOT NULL
) STRICT;
CREATE INDEX topic_events_event_id ON topic_events (event_id);
CREATE INDEX topic_events_scope ON topic_events (scope, seq);
CREATE INDEX topic_events_topic ON topic_events (topic, seq);

ALTER TABLE intents ADD COLUMN event_id TEXT;
CREATE INDEX intents_event ON intents (scope, event_id) WHERE event_id IS NOT NULL;
