-- Events and subscriptions: a destination subscribes to topics (kept as given, for the API, and
-- as the rows a fan-out matches with one join); an event is recorded once per scope/event_id, in
-- the commit that makes its intents, each of which names it (event_id, in the event's scope).
ALTER TABLE destinations ADD COLUMN subscriptions text NOT NULL DEFAULT '[]';

CREATE TABLE subscriptions (
    destination text NOT NULL REFERENCES destinations(id),
    prefix      text NOT NULL,      -- the whole topic when exact, else what a matching topic starts with
    exact       boolean NOT NULL,
    scope       text                -- NULL: every scope (that holds a grant for the destination)
);
CREATE INDEX subscriptions_destination ON subscriptions (destination);

CREATE TABLE topic_events (
    seq            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key      text NOT NULL UNIQUE,           -- scope/event_id
    event_id       text NOT NULL,
    scope          text NOT NULL,
    topic          text NOT NULL,
    payload        text NOT NULL,                  -- RFC 8785 canonical JSON
    payload_digest text NOT NULL,
    ordering_key   text,
    skipped        text NOT NULL DEFAULT '[]',     -- JSON [[destination, reason], ...]: no intent made
    actor          text NOT NULL,
    created_at     timestamptz NOT NULL
);
CREATE INDEX topic_events_event_id ON topic_events (event_id);
CREATE INDEX topic_events_scope ON topic_events (scope, seq);
CREATE INDEX topic_events_topic ON topic_events (topic, seq);

ALTER TABLE intents ADD COLUMN event_id text;
CREATE INDEX intents_event ON intents (scope, event_id) WHERE event_id IS NOT NULL;
