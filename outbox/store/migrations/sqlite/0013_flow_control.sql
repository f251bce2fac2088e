-- Flow control per destination (outbox.flow; PostgreSQL's 0013 says more): a rate limit (per
-- second, with a burst), a cap on intents in flight, and a pause a receiver asked for. Null: none.
ALTER TABLE destinations ADD COLUMN rate_per_second REAL;
ALTER TABLE destinations ADD COLUMN rate_burst INTEGER;
ALTER TABLE destinations ADD COLUMN max_in_flight INTEGER;
ALTER TABLE destinations ADD COLUMN paused_until INTEGER;
-- A rate-limited destination's token bucket, made by its first claim (the one writer's claims
-- take turns already: no lock row is needed for them).
CREATE TABLE destination_buckets (
    destination TEXT PRIMARY KEY REFERENCES destinations (id) ON DELETE CASCADE,
    tokens      REAL NOT NULL,
    refilled_at INTEGER NOT NULL
);
