-- The flow-control claim (0013's outbox_claim_limited) again, unable to fail on one destination's
-- values: it computes with each stored limit as the nearest the API takes (outbox.flow: a rate of
-- 0.00001 to 100000 a second, NaN the slowest; a burst and max_in_flight of 1 to 100000, no burst
-- 1), a bucket's count kept between 0 and its burst (NaN: 0), an infinite refill time as no refill
-- (later) or a full one (earlier), and the time it says to look again no later than
-- 9999-12-31T23:59:59Z (epoch 253402300799, the last whole second a Python datetime holds). 0013
-- answered year 33715 for a rate of 1e-12 (which the API took then), which failed the reading of
-- every cycle's answer, and for 5e-324 its division overflowed and failed the cycle statement
-- itself: nothing was delivered to any destination. The destination's record says what is not as
-- stored (Destination.unusable), and the sender sends it nothing until it is put again. Otherwise
-- unchanged: see 0013 for what it does.
CREATE OR REPLACE FUNCTION outbox_claim_limited(claimer text, claimed_at timestamptz, lease_until timestamptz,
                                                cap integer)
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
    v_rate double precision;  -- the limits as computed with (null: none)
    v_burst integer;
    v_cap integer;
    v_elapsed double precision;
    v_horizon constant double precision := 253402300799;
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
            flow_retry_at := least(extract(epoch FROM d.paused_until), v_horizon);  -- ('infinity': the horizon)
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- (greatest and least pass over a null: none stays none by the CASE)
        v_rate := CASE WHEN d.rate_per_second IS NULL THEN NULL WHEN d.rate_per_second = 'NaN' THEN 0.00001
                       ELSE least(greatest(d.rate_per_second, 0.00001), 100000) END;
        v_burst := least(greatest(coalesce(d.rate_burst, 1), 1), 100000);
        v_cap := CASE WHEN d.max_in_flight IS NULL THEN NULL ELSE least(greatest(d.max_in_flight, 1), 100000) END;
        INSERT INTO destination_buckets (destination, tokens, refilled_at)
        VALUES (d.id, CASE WHEN v_rate IS NULL THEN 0 ELSE v_burst END, claimed_at)
        ON CONFLICT (destination) DO NOTHING;
        SELECT * INTO bucket FROM destination_buckets AS k WHERE k.destination = d.id FOR UPDATE;
        v_room := v_left;  -- what max_in_flight leaves room for
        IF v_cap IS NOT NULL THEN
            SELECT count(*) INTO v_in_flight FROM (  -- (enough once it reaches the limit)
                SELECT 1 FROM intents AS i WHERE i.destination = d.id AND i.status = 'leased'
                LIMIT v_cap) AS l;
            v_room := greatest(0, least(v_left, v_cap - v_in_flight));
        END IF;
        v_allowed := v_room;  -- and of that, what the tokens allow
        IF v_rate IS NOT NULL THEN
            v_elapsed := CASE WHEN isfinite(bucket.refilled_at)
                                  THEN greatest(0, extract(epoch FROM claimed_at - bucket.refilled_at))
                              WHEN bucket.refilled_at > claimed_at THEN 0
                              ELSE 'Infinity' END;
            v_tokens := least(v_burst::double precision,
                              CASE WHEN bucket.tokens = 'NaN' THEN 0
                                   ELSE least(greatest(bucket.tokens, 0), v_burst) END + v_elapsed * v_rate);
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
        IF v_rate IS NOT NULL THEN
            v_tokens := v_tokens - cardinality(flow_leased);
            IF cardinality(flow_leased) > 0 THEN
                UPDATE destination_buckets SET tokens = v_tokens, refilled_at = greatest(refilled_at, claimed_at)
                WHERE destination = d.id;
            END IF;
            IF held_rate > 0 THEN  -- (1 - v_tokens) / v_rate is at most 100,000 s: clamped all the same
                flow_retry_at := least(extract(epoch FROM claimed_at) + (1 - v_tokens) / v_rate, v_horizon);
            END IF;
        END IF;
        v_left := v_left - cardinality(flow_leased);
        CONTINUE WHEN v_due = 0;
        RETURN NEXT;
    END LOOP;
END;
$$;
