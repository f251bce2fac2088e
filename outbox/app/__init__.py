"""The app layer: what serves the outbox to people and programs, on the core (``outbox``) and the
sender. ``api`` (``create_app``: the HTTP API, assembling ``routes``), ``service``
(``create_service``: the API composed with the sender, as ``outbox serve`` runs it), ``openapi``
(what no type says in the API's document), ``web`` (its pages and assets), ``problems`` (RFC 9457
answers), ``console`` (the operators' pages) and ``cli`` (the ``outbox`` command).

Nothing is imported here, so that ``outbox.app.cli`` (the command's ``--help``) starts at once."""
