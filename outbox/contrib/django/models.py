"""No models: the outbox's tables are its own (``schema``). The module is here so that Django
tells the app when ``migrate`` has run (``post_migrate`` is sent to apps with a models module)."""
