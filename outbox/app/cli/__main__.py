"""``python -m outbox.cli``, as the installed ``outbox`` command."""

from . import main

main()
