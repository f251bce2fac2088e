-- The W3C trace context of an intent's create span (outbox.tracing), as a JSON object holding
-- "traceparent" and, when there is one, "tracestate"; NULL: the producer sent none and no SDK made
-- one. Each attempt's send span is its child, so one trace runs from the producer to the receiver.
ALTER TABLE intents ADD COLUMN trace_context TEXT;
