-- Tenant-owned destinations (outbox.destinations.Destination.owner): the one scope whose intents and events may reach
-- a destination, which manages it; null: a shared destination an admin registered, reached by grants as before. And
-- the end of a secret rotation's window (previous_secrets_until): the previous secrets sign until then, the newest
-- alone after; null: they sign until the rotation is ended by hand (drop_previous_secrets), as before.
ALTER TABLE destinations ADD COLUMN owner TEXT;
ALTER TABLE destinations ADD COLUMN previous_secrets_until INTEGER;
CREATE INDEX destinations_owner ON destinations (owner) WHERE owner IS NOT NULL;
