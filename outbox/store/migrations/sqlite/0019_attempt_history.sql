-- What an attempt's start and settle record is kept in the attempt's row (PostgreSQL's 0019 says how; the
-- timeline is read as outbox/store/timeline.py says). The rows written before that name their attempt move into it.
ALTER TABLE attempts ADD COLUMN events TEXT NOT NULL DEFAULT '[]';
CREATE TEMPORARY TABLE moved AS
SELECT e.id, e.intent_seq, a.attempt_id,
       json_array(e.kind,
                  strftime('%Y-%m-%dT%H:%M:%S', (e.at - (e.at % 1000000 + 1000000) % 1000000) / 1000000, 'unixepoch')
                  || printf('.%06d+00:00', (e.at % 1000000 + 1000000) % 1000000),
                  e.actor, e.reason, json(e.data)) AS entry
FROM events AS e JOIN attempts AS a ON a.intent_seq = e.intent_seq AND a.attempt_id = json_extract(e.data, '$.attempt_id')
WHERE e.kind IN ('attempt_started', 'attempt_finished');
UPDATE attempts SET events = (
    SELECT json_group_array(json(grouped)) FROM (
        SELECT json_array(coalesce((SELECT max(kept.id) FROM events AS kept
                                    WHERE kept.intent_seq = moved.intent_seq AND kept.id < moved.id
                                      AND kept.id NOT IN (SELECT id FROM moved)), 0),
                          json_array(json(moved.entry))) AS grouped
        FROM moved WHERE moved.attempt_id = attempts.attempt_id ORDER BY moved.id))
WHERE attempt_id IN (SELECT attempt_id FROM moved);
DELETE FROM events WHERE id IN (SELECT id FROM moved);
DROP TABLE moved;
