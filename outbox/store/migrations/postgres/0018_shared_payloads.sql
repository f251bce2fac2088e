-- An event's payload is stored once, in its event's row (topic_events.payload), not copied into
-- each of its intents: an intent of an event names the event whose payload it sends
-- (payload_event, that row's seq) and keeps '' in its own payload column, which is no JSON; NULL:
-- the intent carries its own payload (a direct intent's, as before). Every statement that reads
-- an intent reads its payload through the event_payload block of sql/postgres.sql. The intents of
-- events recorded before are converted here. No foreign key: its check would run a lookup for
-- every intent a fan-out inserts; the trigger below keeps what one would on the deleting side.
ALTER TABLE intents ADD COLUMN payload_event bigint;
UPDATE intents SET payload_event = e.seq, payload = ''
FROM topic_events AS e
WHERE intents.event_id IS NOT NULL AND e.scope = intents.scope AND e.event_id = intents.event_id
  AND e.payload_digest = intents.payload_digest AND e.payload = intents.payload;
-- An event's row is deleted only once no intent sends its payload: pruning removes intents (their
-- attempts and history) and never events, and whatever deletes events must leave these alone. Found
-- through intents_event; costs nothing on a publish or a delivery.
CREATE FUNCTION outbox_keep_shared_payload() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM intents
               WHERE intents.scope = OLD.scope AND intents.event_id = OLD.event_id
                 AND intents.payload_event = OLD.seq) THEN
        RAISE EXCEPTION 'the payload of event % is sent by intents that remain: delete them first', OLD.event_key
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN OLD;
END;
$$;
CREATE TRIGGER topic_events_payload_in_use BEFORE DELETE ON topic_events
FOR EACH ROW EXECUTE FUNCTION outbox_keep_shared_payload();
