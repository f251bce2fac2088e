-- The console's last hour (attempts per minute and destination): attempts by when they finished.
CREATE INDEX attempts_finished ON attempts (finished_at) WHERE finished_at IS NOT NULL;
