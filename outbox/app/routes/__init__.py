"""The HTTP API's routes, one module per noun, and what they share. ``outbox.api.create_app``
assembles them into the application.

- ``auth``: the bearer token's role and scopes, as route dependencies
- ``bodies``: the body-limits middleware: a JSON body bounded and strictly parsed before a route reads it
- ``handlers``: every error answered as problem+json
- ``probes``: ``/healthz``, ``/readyz``, ``/metrics``
- ``intents``: enqueue, show (long poll), list
- ``operators``: replay, resolve, cancel, approve, reject, bulk replay
- ``registry``: destinations and grants
- ``tokens``: API tokens (admin)
- ``tenant``: a tenant's own destinations and deliveries (``/v1/tenant``)
- ``portal_links``: the tenant portal's single-use links (``/v1/tenants/{scope}/portal-links``)

Their bodies and answers are the models of ``outbox.shapes``.

None of them knows the sender: what the operators' replays ask the authority provider is
handed to the app as ``app.state.authorize`` (see ``outbox.service``).
"""
