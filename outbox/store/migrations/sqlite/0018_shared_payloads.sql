-- An event's payload is stored once, in its event's row (topic_events.payload), not copied into
-- each of its intents: an intent of an event names the event whose payload it sends
-- (payload_event, that row's seq) and keeps '' in its own payload column, which is no JSON; NULL:
-- the intent carries its own payload (a direct intent's, as before). Every statement that reads
-- an intent reads its payload through the event_payload block of sql/sqlite.sql. The intents
-- of events recorded before are converted here (the pages they free are reused as the file grows).
-- No foreign key, as on PostgreSQL (whose check would cost a lookup per intent a fan-out makes):
-- the trigger below keeps what one would on the deleting side.
ALTER TABLE intents ADD COLUMN payload_event INTEGER;
UPDATE intents SET payload_event = e.seq, payload = ''
FROM topic_events AS e
WHERE intents.event_id IS NOT NULL AND e.scope = intents.scope AND e.event_id = intents.event_id
  AND e.payload_digest = intents.payload_digest AND e.payload = intents.payload;
-- An event's row is deleted only once no intent sends its payload: pruning removes intents (their
-- attempts and history) and never events, and whatever deletes events must leave these alone. Found
-- through intents_event; costs nothing on a publish or a delivery.
CREATE TRIGGER topic_events_payload_in_use BEFORE DELETE ON topic_events
WHEN EXISTS (SELECT 1 FROM intents
             WHERE intents.scope = OLD.scope AND intents.event_id = OLD.event_id
               AND intents.payload_event = OLD.seq)
BEGIN
    SELECT RAISE(ABORT, 'the event''s payload is sent by intents that remain: delete them first');
END;
