-- A destination's channel-specific settings are one JSON object, so a channel brings its own
-- fields without a column each: the webhook's url moves into it, as {"url": ...}.
ALTER TABLE destinations ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';
UPDATE destinations SET settings = json_object('url', url);
ALTER TABLE destinations DROP COLUMN url;
