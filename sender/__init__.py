"""The delivery worker: leases due intents, re-checks authority, sends, records outcomes."""
