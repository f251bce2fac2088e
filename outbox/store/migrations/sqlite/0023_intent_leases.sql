-- Nothing changes here: on PostgreSQL, 0023 keeps each lease in a row of its own (intent_leases), apart from the
-- intent's record, for many claimers sharing one table; SQLite has one writer, and keeps a lease in the intent's row.
-- The version is recorded all the same, so both dialects count their migrations alike.
SELECT 1;
