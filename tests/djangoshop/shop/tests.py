"""The project's own tests, under Django's test runner (``manage.py test``): the test database it
makes, and each clone of it under ``--parallel``, has the outbox's tables, applied by Django's
``migrate`` through the outbox's app, so a view enqueues there as in production."""

import asyncio

from django.db import connection
from django.test import TestCase

from outbox import DestinationSpec, Outbox
from outbox.contrib.django.conf import database_url


def intents() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT action_id, status FROM intents ORDER BY action_id")
        return [tuple(row) for row in cursor.fetchall()]


class Registered(TestCase):
    """Each class runs on a test database of its own under ``--parallel``; ``billing`` is registered
    in it as ``outbox destinations put`` would."""

    @classmethod
    def setUpClass(cls) -> None:
        assert {"intents", "schema_migrations"} <= set(connection.introspection.table_names()), (
            f"the test database {connection.settings_dict['NAME']} has no outbox tables")

        async def register() -> None:
            async with await Outbox.open(database_url("default", derived=True)) as box:
                await box.put_destination("billing", DestinationSpec(url="https://billing.example.com/hook",
                                                                     secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))

        asyncio.run(register())
        super().setUpClass()


class Enqueue(Registered):
    def test_a_view_enqueues_in_the_test_database(self) -> None:
        self.assertEqual(self.client.post("/explicit/1").status_code, 201)
        self.assertEqual(intents(), [("order-1", "pending")])


class Refusals(Registered):
    def test_a_caught_refusal_keeps_the_order(self) -> None:
        self.assertEqual(self.client.post("/refused/6").status_code, 201)
        self.assertEqual(intents(), [])
