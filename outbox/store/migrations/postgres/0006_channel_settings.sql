-- A destination's channel-specific settings are one JSON object, so a channel brings its own
-- fields without a column each: the webhook's url moves into it, as {"url": ...}.
ALTER TABLE destinations ADD COLUMN settings jsonb NOT NULL DEFAULT '{}';
UPDATE destinations SET settings = jsonb_build_object('url', url);
ALTER TABLE destinations DROP COLUMN url;
