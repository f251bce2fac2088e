"""An application process that writes its own row and enqueues its intent in one transaction, then
waits before committing, so a test can ``kill -9`` it on either side of the commit.

    python -m tests.acceptance.app_process KIND URL ORDER     (from the repository's root)

KIND is one of ``tests.apps.KINDS``; URL the outbox's database; ORDER the order's number (its row
in ``orders``, its intent ``order-ORDER`` to ``hook`` for acme). It prints ``written`` once the row
and the intent are written and not committed, then waits for a line on stdin: ``commit`` commits
and prints ``committed``, then it waits again, for its end; anything else rolls back.
"""

from __future__ import annotations

import asyncio
import sys

from tests.apps import KINDS


def say(line: str) -> None:
    print(line, flush=True)


async def main(kind: str, url: str, order: int) -> None:
    app = KINDS[kind](url)
    await app.connect()
    read = lambda: asyncio.to_thread(sys.stdin.readline)
    try:
        async with app.transaction():
            await app.insert(order)
            await app.enqueue(destination="hook", scope="acme", action_id=f"order-{order}", payload={"order": order})
            say("written")
            if (await read()).strip() != "commit":
                raise SystemExit("rolled back")
        say("committed")
        await read()
    finally:
        await app.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
