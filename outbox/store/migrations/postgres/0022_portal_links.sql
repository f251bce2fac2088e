-- The tenant portal's links and sessions (outbox.portal.PortalLink): a link an admin or a producer minted for one
-- scope, stored by its token's SHA-256 only. It opens once, before expires_at: opening sets session_hash (the
-- SHA-256 of the new session's id) and session_expires_at, so a second opening finds it taken. The session it
-- starts is good until session_expires_at, and only while the token that minted it is not revoked.
CREATE TABLE portal_links (
    link_hash          text PRIMARY KEY,
    token_id           text NOT NULL REFERENCES tokens (id),
    scope              text NOT NULL,
    read_only          boolean NOT NULL,
    session_seconds    integer NOT NULL,
    created_at         timestamptz NOT NULL,
    expires_at         timestamptz NOT NULL,
    session_hash       text UNIQUE,
    session_expires_at timestamptz
);
CREATE INDEX portal_links_expiry ON portal_links (expires_at);
