-- A destination's own retry schedule and maximum age: retry_schedule is a JSON array of delays in
-- seconds (the delay before retry n is its n-th entry; NULL: the exponential backoff), and
-- max_age_seconds how long after its enqueue an intent may still be attempted (NULL: no limit).
-- The age is judged at each decision from the destination's current value, so nothing of it is
-- stored on the intents; an intent keeps replayed_after, the attempts made before its last replay,
-- since a replay starts the schedule over.
ALTER TABLE destinations ADD COLUMN retry_schedule jsonb;
ALTER TABLE destinations ADD COLUMN max_age_seconds integer;
ALTER TABLE intents ADD COLUMN replayed_after integer NOT NULL DEFAULT 0;
