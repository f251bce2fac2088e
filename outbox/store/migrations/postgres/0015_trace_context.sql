-- The W3C trace context of an intent's create span (outbox.tracing), as a JSON object holding
-- "traceparent" and, when there is one, "tracestate"; NULL: the producer sent none and no SDK made
-- one. Kept as text, as written: it is only ever read back whole, never queried.
ALTER TABLE intents ADD COLUMN trace_context text;
