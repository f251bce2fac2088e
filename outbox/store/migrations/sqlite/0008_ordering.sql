-- Ordering per key: an intent may carry an ordering_key; a destination with ordering 'key' delivers
-- the intents of one key in enqueue order (seq), and ordering_on_dead says whether a dead letter
-- ('dead' or 'revoked') blocks its key until an operator acts ('block') or is passed over ('skip').
ALTER TABLE intents ADD COLUMN ordering_key TEXT;
ALTER TABLE destinations ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none';
ALTER TABLE destinations ADD COLUMN ordering_on_dead TEXT NOT NULL DEFAULT 'block';
-- "Is an earlier intent of this key still in the way?" is one seek, whatever the key's history:
-- only intents that can block (every status but delivered and cancelled) are in it.
CREATE INDEX intents_ordering ON intents (destination, ordering_key, seq)
WHERE ordering_key IS NOT NULL AND status IN ('pending', 'leased', 'held', 'unknown', 'dead', 'revoked');
