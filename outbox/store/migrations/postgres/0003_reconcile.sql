-- Destinations whose receivers answer the reconcile probe (the receivers' middleware).
ALTER TABLE destinations ADD COLUMN reconcile boolean NOT NULL DEFAULT false;
