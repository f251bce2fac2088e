"""The outbox inside the frameworks applications are written with: ``outbox.contrib.django``
(an installable Django app: enqueue in the current ``atomic()`` block, ``manage.py
outbox_migrate``) and ``outbox.contrib.alembic`` (Alembic's autogenerate leaves the outbox's
tables alone). Each imports its framework only when the application imports it."""
