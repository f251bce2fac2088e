"""The README's RabbitMQ example runs as printed, as a script, against the machine's RabbitMQ under
an exchange and queue of this run's (given through the variables the example reads), deleted after."""

from __future__ import annotations

from pathlib import Path

from receivers import wire
from tests.conftest import SECRET
from tests.rabbitmq import PORT, Rabbit

from .test_readme import bash, python_blocks


async def test_the_rabbitmq_example_publishes_a_signed_message_to_the_queue_it_binds(
        rabbit: Rabbit, tmp_path: Path) -> None:
    (tmp_path / "rabbitmq_example.py").write_text(python_blocks()["rabbitmq"])
    try:
        shown = bash("python rabbitmq_example.py", tmp_path, RABBITMQ_URL=f"amqp://guest@127.0.0.1:{PORT}/",
                     RABBITMQ_EXCHANGE=rabbit.exchange, RABBITMQ_QUEUE=rabbit.queue, RABBITMQ_SIGNING_SECRET=SECRET)
    finally:
        await rabbit.channel.queue_delete(rabbit.queue)
        await rabbit.channel.exchange_delete(rabbit.exchange)
    status, message = [line for line in shown.splitlines() if line]
    assert status.startswith(f"delivered {rabbit.exchange}/order.paid/")
    message_id, body, headers = message.split(" ", 2)
    assert (message_id, body) == ("acme/order-42-paid", """b'{"event":"paid","order":42}'""")
    assert "'idempotency-key': 'acme/order-42-paid'" in headers and "'outbox-fence': '1'" in headers
    assert f"'outbox-attempt-id': '{status.rsplit('/', 1)[1]}'" in headers
    assert f"'{wire.KAFKA_PAYLOAD_DIGEST}': 'sha256:" in headers and "'webhook-signature': 'v1," in headers
    assert (tmp_path / "rabbitmq.db").exists()
