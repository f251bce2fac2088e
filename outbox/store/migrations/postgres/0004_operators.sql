-- Operators: approvals bound to a payload digest with an expiry, and retention of finished intents.
ALTER TABLE intents ADD COLUMN approved_digest text;
ALTER TABLE intents ADD COLUMN approval_expires_at timestamptz;
ALTER TABLE intents ADD COLUMN approved_by text;
-- Pruning finds finished intents by age without scanning the live ones.
CREATE INDEX intents_finished ON intents (updated_at) WHERE status IN ('delivered', 'cancelled');
