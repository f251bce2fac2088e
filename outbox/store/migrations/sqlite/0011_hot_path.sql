-- The hot path's schema (PostgreSQL's 0011 says why): attempts_in_flight is dropped, so a start
-- writes one index entry fewer; an intent's unfinished attempt under its fence is found by a seek
-- of attempts_intent among its few attempts. PostgreSQL's fill factors have no SQLite equivalent.
DROP INDEX attempts_in_flight;
