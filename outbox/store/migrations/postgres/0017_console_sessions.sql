-- The console's sign-ins (outbox.tokens.ConsoleSession): the cookie holds a random session id,
-- this table only its SHA-256. A session is good until expires_at, and only while the token it
-- was opened with is not revoked (each request joins the token); signing out deletes it. Each
-- new sign-in drops the expired ones, those of revoked tokens, and its token's oldest beyond a
-- bound (outbox.tokens.SESSIONS_PER_TOKEN).
CREATE TABLE console_sessions (
    id_hash    text PRIMARY KEY,
    token_id   text NOT NULL REFERENCES tokens (id),
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX console_sessions_token ON console_sessions (token_id, created_at);
CREATE INDEX console_sessions_expiry ON console_sessions (expires_at);
