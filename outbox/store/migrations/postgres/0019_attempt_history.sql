-- What an attempt's start and settle record is kept in the attempt's row (outbox/store/timeline.py says how the
-- timeline is read from it and from events): each write of the attempt appends one group
-- [after, [[kind, at, actor, reason, data], ...]], after being the id of the intent's last events row then.
ALTER TABLE attempts ADD COLUMN events jsonb NOT NULL DEFAULT '[]';
-- The rows written before that name their attempt (attempt_started, attempt_finished) move into it, each as a group
-- of its own placed after the last row that stays before it: the timeline reads the same. The others stay rows.
CREATE TEMPORARY TABLE moved ON COMMIT DROP AS
SELECT e.id, e.intent_seq, a.attempt_id,
       jsonb_build_array(e.kind, to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'), e.actor,
                         e.reason, e.data) AS entry
FROM events AS e JOIN attempts AS a ON a.intent_seq = e.intent_seq AND a.attempt_id = e.data ->> 'attempt_id'
WHERE e.kind IN ('attempt_started', 'attempt_finished');
UPDATE attempts SET events = grouped.events
FROM (SELECT m.attempt_id, jsonb_agg(jsonb_build_array(
          coalesce((SELECT max(kept.id) FROM events AS kept
                    WHERE kept.intent_seq = m.intent_seq AND kept.id < m.id
                      AND NOT EXISTS (SELECT 1 FROM moved WHERE moved.id = kept.id)), 0),
          jsonb_build_array(m.entry)) ORDER BY m.id) AS events
      FROM moved AS m GROUP BY m.attempt_id) AS grouped
WHERE attempts.attempt_id = grouped.attempt_id;
DELETE FROM events WHERE id IN (SELECT id FROM moved);
-- An attempt's row is written twice, at its start and its settle: room left on each page lets the settle's version
-- go beside the first (a HOT update: no index entries, since neither changes an indexed column).
ALTER TABLE attempts SET (fillfactor = 50);
