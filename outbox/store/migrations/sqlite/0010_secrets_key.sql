-- Destination secrets are sealed at rest (outbox.keyring): this one row names the key they are
-- sealed under, by its id (never the key), so every process seals with the same key and a wrong
-- key is found when the outbox opens. `destinations.secrets` now holds the sealed form (a JSON
-- object); plain lists written before are sealed by the outbox when it next opens the database.
CREATE TABLE secrets_key (
    only_row INTEGER PRIMARY KEY CHECK (only_row = 1),
    key_id   TEXT NOT NULL
) STRICT;
