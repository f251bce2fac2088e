-- Action ids are unique per scope, not across them, so one tenant can neither block nor learn of
-- another's: the unique column becomes the intent's key, scope/action_id (an action id never holds
-- '/'), which is also the key receivers deduplicate on.
ALTER TABLE intents RENAME COLUMN action_id TO intent_key;
ALTER TABLE intents RENAME CONSTRAINT intents_action_id_key TO intents_intent_key_key;
UPDATE intents SET intent_key = scope || '/' || intent_key;
ALTER TABLE intents ADD COLUMN action_id text NOT NULL DEFAULT '';
UPDATE intents SET action_id = substr(intent_key, length(scope) + 2);
CREATE INDEX intents_action ON intents (action_id);
