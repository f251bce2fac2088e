-- The hot path's schema (PostgreSQL's 0011 says why): attempts_in_flight is dropped, so a start
-- writes one index entry fewer, and an intent's unfinished attempt under its fence is found by a
-- seek of attempts_intent among its few attempts; attempts_finished gives way to attempts_started,
-- so an attempt's finish changes no indexed column (the console's activity counts the attempts
-- started in its window). PostgreSQL's fill factors have no SQLite equivalent.
DROP INDEX attempts_in_flight;
DROP INDEX attempts_finished;
CREATE INDEX attempts_started ON attempts (started_at);
