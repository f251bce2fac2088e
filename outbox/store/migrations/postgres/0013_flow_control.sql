-- Flow control per destination (outbox.flow): a rate limit (per second, with a burst), a cap on
-- intents in flight, and a pause a receiver asked for (429/503 with Retry-After). Null: none.
ALTER TABLE destinations ADD COLUMN rate_per_second double precision, ADD COLUMN rate_burst integer,
                         ADD COLUMN max_in_flight integer, ADD COLUMN paused_until timestamptz;
-- One row per limited destination, made by its first claim: its token bucket, and the row every
-- claim of the destination locks, so claims by different processes take turns on it alone.
CREATE TABLE destination_buckets (
    destination text PRIMARY KEY REFERENCES destinations (id) ON DELETE CASCADE,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);
-- The claim's part for limited and paused destinations (the cycle statement calls it only when
-- there are some): for each, in id order (claims lock their rows in one order), up to cap in all,
-- lease what its limits allow of its oldest due intents, append their "leased" events, and say
-- how many due ones each limit held back (counted only when a limit took less than the claim
-- could have, so a limit that does not bind costs no count; those waiting behind their ordering
-- key are counted too). A limited destination's bucket row is locked first;
-- VOLATILE, so every statement after that lock sees a fresh snapshot: the leases of every claim
-- that held the lock before are counted, whatever the calling statement's snapshot. Its due
-- intents are picked as the cycle's claim picks (the claimable block of sql/postgres.sql, the
-- same condition). A held intent is counted against the first limit that holds it: paused, then
-- max_in_flight, then rate (outbox.flow.allowance, the same arithmetic).
CREATE FUNCTION outbox_claim_limited(claimer text, claimed_at timestamptz, lease_until timestamptz, cap integer)
RETURNS TABLE (flow_destination text, held_paused integer, held_in_flight integer, held_rate integer,
               flow_retry_at double precision, flow_leased intents[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    d destinations;
    bucket destination_buckets;
    v_left integer := cap;
    v_due integer;
    v_in_flight integer;
    v_tokens double precision;
    v_room integer;
    v_allowed integer;
BEGIN
    FOR d IN SELECT * FROM destinations AS f
             WHERE f.max_in_flight IS NOT NULL OR f.rate_per_second IS NOT NULL OR f.paused_until > claimed_at
             ORDER BY f.id
    LOOP
        EXIT WHEN v_left <= 0;
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM intents AS due
            WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at);
        flow_destination := d.id; held_paused := 0; held_in_flight := 0; held_rate := 0;
        flow_retry_at := NULL; flow_leased := '{}';
        IF d.paused_until > claimed_at THEN
            SELECT count(*) INTO v_due FROM (
                SELECT 1 FROM intents AS due
                WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                LIMIT v_left) AS w;
            held_paused := v_due;
            flow_retry_at := extract(epoch FROM d.paused_until);
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO destination_buckets (destination, tokens, refilled_at)
        VALUES (d.id, coalesce(d.rate_burst, 0), claimed_at) ON CONFLICT (destination) DO NOTHING;
        SELECT * INTO bucket FROM destination_buckets AS k WHERE k.destination = d.id FOR UPDATE;
        v_room := v_left;  -- what max_in_flight leaves room for
        IF d.max_in_flight IS NOT NULL THEN
            SELECT count(*) INTO v_in_flight FROM (  -- (enough once it reaches the limit)
                SELECT 1 FROM intents AS i WHERE i.destination = d.id AND i.status = 'leased'
                LIMIT d.max_in_flight) AS l;
            v_room := greatest(0, least(v_left, d.max_in_flight - v_in_flight));
        END IF;
        v_allowed := v_room;  -- and of that, what the tokens allow
        IF d.rate_per_second IS NOT NULL THEN
            v_tokens := least(d.rate_burst::double precision, bucket.tokens
                              + greatest(0, extract(epoch FROM claimed_at - bucket.refilled_at)) * d.rate_per_second);
            v_allowed := greatest(0, least(v_room, floor(v_tokens)::integer));
        END IF;
        IF v_allowed > 0 THEN
            WITH picked AS (
                SELECT seq FROM intents AS due
                WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                  AND (due.ordering_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM destinations AS o, intents AS earlier
                      WHERE o.id = due.destination AND o.ordering = 'key'
                        AND earlier.destination = due.destination AND earlier.ordering_key = due.ordering_key
                        AND earlier.seq < due.seq
                        AND earlier.status IN ('pending', 'leased', 'held', 'unknown', 'dead', 'revoked')
                        AND (earlier.status NOT IN ('dead', 'revoked') OR o.ordering_on_dead = 'block')))
                ORDER BY due.next_attempt_at LIMIT v_allowed
                FOR UPDATE OF due SKIP LOCKED
            ), took AS (
                UPDATE intents SET status = 'leased', lease_owner = claimer, lease_expires_at = lease_until,
                                   fence = intents.fence + 1, updated_at = claimed_at
                WHERE intents.seq = ANY(ARRAY(SELECT seq FROM picked))
                RETURNING intents
            ), logged AS (
                INSERT INTO events (intent_seq, kind, at, actor, reason, data)
                SELECT (took.intents).seq, 'leased', claimed_at, claimer, NULL,
                       jsonb_build_object('fence', (took.intents).fence)
                FROM took ORDER BY 1
            )
            SELECT coalesce(array_agg(took.intents), '{}') INTO flow_leased FROM took;
        END IF;
        v_due := cardinality(flow_leased);
        IF v_due = v_allowed AND v_allowed < v_left THEN  -- a limit took less than the claim could: count the rest
            SELECT v_due + count(*) INTO v_due FROM (
                SELECT 1 FROM intents AS due
                WHERE due.destination = d.id AND due.status = 'pending' AND due.next_attempt_at <= claimed_at
                LIMIT v_left - v_due) AS w;
        END IF;
        held_in_flight := greatest(0, v_due - v_room);
        held_rate := greatest(0, least(v_due, v_room) - cardinality(flow_leased));
        IF d.rate_per_second IS NOT NULL THEN
            v_tokens := v_tokens - cardinality(flow_leased);
            IF cardinality(flow_leased) > 0 THEN
                UPDATE destination_buckets SET tokens = v_tokens, refilled_at = greatest(refilled_at, claimed_at)
                WHERE destination = d.id;
            END IF;
            IF held_rate > 0 THEN
                flow_retry_at := extract(epoch FROM claimed_at) + (1 - v_tokens) / d.rate_per_second;
            END IF;
        END IF;
        v_left := v_left - cardinality(flow_leased);
        CONTINUE WHEN v_due = 0;
        RETURN NEXT;
    END LOOP;
END;
$$;
