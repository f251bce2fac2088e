"""Intents from the command line: ``enqueue``, ``show`` and ``list``, and the operators' powers
over them (``replay``, ``resolve``, ``cancel``, ``approve``, ``reject``, ``prune``)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from ...errors import InvalidInput, OutboxError
from ...model import REPLAYABLE, Resolution, Status
from .context import Context, cli_actor, fields, run, shapes
from .options import TIMESTAMP

if TYPE_CHECKING:
    from datetime import datetime

    from ... import operations
    from ...outbox import Outbox


def _payload(text: str) -> Any:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"--payload {text}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not JSON: {exc}") from None


@click.command()
@click.option("--destination", required=True, help="A registered destination id.")
@click.option("--scope", required=True, help="Tenant/account on whose authority the effect is made.")
@click.option("--payload", required=True, help="JSON text, @file, or - for standard input.")
@click.option("--action-id", help="Your operation id [default: a new UUIDv7].")
@click.option("--not-before", type=TIMESTAMP, help="Do not send earlier (RFC 3339, with timezone).")
@click.option("--expires-at", type=TIMESTAMP, help="Dead-letter if not sent by then (RFC 3339, with timezone).")
@click.option("--max-attempts", type=int, help="Attempts before a dead letter, 1-1000 [default: 24, "
                                               "OUTBOX_DEFAULT_MAX_ATTEMPTS].")
@click.option("--ordering-key", help="Deliver in enqueue order with the intents of this key (destinations with "
                                     "ordering=key).")
@run
async def enqueue(
    ctx: Context,
    box: Outbox,
    destination: str,
    scope: str,
    payload: str,
    action_id: str | None,
    not_before: datetime | None,
    expires_at: datetime | None,
    max_attempts: int | None,
    ordering_key: str | None,
) -> None:
    """Record an intent (idempotent on --action-id)."""
    result = await box.enqueue(
        destination=destination,
        scope=scope,
        payload=_payload(payload),
        action_id=action_id,
        not_before=not_before,
        expires_at=expires_at,
        max_attempts=max_attempts,
        ordering_key=ordering_key,
        actor=cli_actor(),
    )
    ctx.emit(
        {**shapes().intent_json(result.intent), "created": result.created},
        f"{'enqueued' if result.created else 'already enqueued'} {result.intent.action_id} "
        f"({result.intent.status.value})",
    )


#: Action ids are unique per scope: the scope is needed only when one is used in several.
SCOPE = click.option("--scope", help="The intent's scope; needed only when its action id is used in several scopes.")


@click.command()
@click.argument("action_id")
@SCOPE
@run
async def show(ctx: Context, box: Outbox, action_id: str, scope: str | None) -> None:
    """Show an intent with its attempts and events."""
    intent, history = await box.show(action_id, scope=scope)
    behind = await box.waiting_behind(intent)
    data = {**shapes().intent_json(intent), "waiting_behind": shapes().waiting_behind_json(behind) if behind else None,
            **shapes().history_json(history)}

    def text() -> str:
        shown: dict[str, Any] = {}
        for name, value in data.items():
            if name not in ("attempts", "events", "waiting_behind"):
                shown[name] = value
            if name == "status" and behind:
                shown["waiting"] = behind.text(intent)
        lines = fields(shown, 16)
        lines.append("attempts:" if data["attempts"] else "attempts: none")
        lines += ["  " + " ".join(str(part) for part in (f"#{a['number']}", a["attempt_id"], a["submission"],
                                                         a["outcome"], a["status_code"], a["error"]) if part)
                  for a in data["attempts"]]
        lines.append("events:")
        lines += [f"  {e['at']} {e['kind']:<16} {e['actor']} {e['reason'] or ''}".rstrip()
                  for e in data["events"]]
        return "\n".join(lines)

    ctx.emit(data, text)


@click.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in Status]),
              help="Repeat for several.")
@click.option("--scope", "scopes", multiple=True, help="Repeat for several.")
@click.option("--destination")
@click.option("--channel", help="An installed channel's name.")
@click.option("--created-after", type=TIMESTAMP, help="RFC 3339, with timezone.")
@click.option("--created-before", type=TIMESTAMP, help="RFC 3339, with timezone.")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", help="The next page: the last page's next_cursor (as the API's cursor).")
@click.option("--before-seq", type=int, hidden=True)  # the cursor's former, undocumented form
@run
async def list_(
    ctx: Context,
    box: Outbox,
    statuses: tuple[str, ...],
    scopes: tuple[str, ...],
    destination: str | None,
    channel: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    limit: int,
    cursor: str | None,
    before_seq: int | None,
) -> None:
    """List intents, newest first."""
    from ...cursor import decode_cursor, encode_cursor
    from ...store import IntentQuery

    if cursor is not None:
        try:
            before_seq = decode_cursor(cursor)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--cursor") from None
    page = await box.list_intents(
        IntentQuery(
            statuses=[Status(s) for s in statuses] or None,
            scopes=list(scopes) or None,
            destination=destination,
            channel=channel,
            created_after=created_after,
            created_before=created_before,
            before_seq=before_seq,
            limit=limit,
        )
    )
    next_cursor = encode_cursor(page.next_seq) if page.next_seq else None
    ctx.emit(
        {"items": [shapes().intent_json(i) for i in page.intents], "next_cursor": next_cursor},
        lambda: "\n".join(
            [f"{'ACTION_ID':<38} {'STATUS':<9} {'DESTINATION':<16} {'SCOPE':<16} ATTEMPTS"]
            + [f"{i.action_id:<38} {i.status.value:<9} {i.destination:<16} {i.scope:<16} "
               f"{i.attempts}/{i.max_attempts}" for i in page.intents]
            + ([f"more: --cursor {next_cursor}"] if next_cursor else [])
        ) if page.intents else "no intents",
    )


# -- operators -----------------------------------------------------------------------------


def _operator(reason: str) -> operations.Actor:
    from ... import operations

    try:
        return operations.Actor(cli_actor(), reason)
    except OutboxError as exc:
        raise click.UsageError(exc.message) from None


REASON = click.option("--reason", required=True, help="Why (recorded with the action).")


@click.command()
@click.argument("action_id", required=False)
@click.option("--status", "statuses", multiple=True,
              type=click.Choice(sorted(s.value for s in REPLAYABLE)),
              help="Bulk: replay intents in this status (repeat; default dead, revoked and unknown).")
@click.option("--destination", help="Bulk: only this destination.")
@click.option("--scope", "scopes", multiple=True,
              help="The intent's scope (needed only when its action id is used in several); bulk: only these "
                   "scopes (repeat).")
@click.option("--dry-run", is_flag=True, help="Bulk: say how many and which, change nothing.")
@click.option("--accept-duplicate-risk", is_flag=True,
              help="Replay even where an earlier attempt may have taken effect and the destination does not dedupe.")
@REASON
@run
async def replay(ctx: Context, box: Outbox, action_id: str | None, statuses: tuple[str, ...],
                 destination: str | None, scopes: tuple[str, ...], dry_run: bool,
                 accept_duplicate_risk: bool, reason: str) -> None:
    """Send an intent again (same action_id), or every intent matching the filters (bulk).

    A bulk replay can be interrupted and run again: what was replayed no longer matches.
    """
    from sender.authority import authorizer

    from ... import operations
    from ...store import IntentQuery

    who = _operator(reason)
    if action_id:
        if statuses or destination or len(scopes) > 1 or dry_run:
            raise click.UsageError("give an ACTION_ID (and at most one --scope) or bulk filters, not both")
        intent = await operations.replay(box, action_id, who, scope=scopes[0] if scopes else None,
                                         authorize=authorizer(box),
                                         accept_duplicate_risk=accept_duplicate_risk)
        ctx.emit(shapes().intent_json(intent), f"replayed {action_id} (now {intent.status.value}, "
                                      f"{intent.max_attempts - intent.attempts} more attempts)")
        return
    query = IntentQuery(statuses=[Status(s) for s in statuses] or None, scopes=list(scopes) or None,
                        destination=destination)
    found = [i async for i in operations.matching(box, operations.replay_filter(query))]
    if dry_run:
        ctx.emit({"dry_run": True, "matched": len(found), "action_ids": [i.action_id for i in found]},
                 lambda: "\n".join([f"{i.action_id}  {i.status.value}  {i.destination}  {i.last_error or ''}"
                                    for i in found] + [f"{len(found)} intent(s) would be replayed"]))
        return
    with click.progressbar(length=len(found), label="replaying", file=sys.stderr,
                           hidden=ctx.as_json or not found) as bar:
        result = await operations.bulk_replay(box, query, who, dry_run=False, authorize=authorizer(box),
                                              accept_duplicate_risk=accept_duplicate_risk,
                                              progress=lambda _: bar.update(1))
    ctx.emit({"dry_run": False, "matched": len(result.matched), "replayed": len(result.replayed),
              "refused": result.refused},
             lambda: "\n".join([f"refused {k}: {v}" for k, v in result.refused.items()]
                               + [f"replayed {len(result.replayed)} of {len(result.matched)}"]))
    if result.refused:
        sys.exit(1)


@click.command()
@click.argument("action_id")
@click.option("--as", "resolution", required=True, type=click.Choice([r.value for r in Resolution]),
              help="delivered (it took effect), retry (it did not), dead (give up).")
@click.option("--external-id", help="The receiver's id for the work, as evidence.")
@SCOPE
@REASON
@run
async def resolve(ctx: Context, box: Outbox, action_id: str, resolution: str, external_id: str | None,
                  scope: str | None, reason: str) -> None:
    """Settle an unknown intent with your evidence."""
    from ... import operations

    intent = await operations.resolve(box, action_id, Resolution(resolution), _operator(reason),
                                      scope=scope, external_id=external_id)
    ctx.emit(shapes().intent_json(intent), f"resolved {action_id}: {intent.status.value}")


def _with_reason(name: str, done: str, about: str) -> click.Command:
    """An operator's command that takes nothing but an intent and a reason, and does what the
    operation of the same ``name`` does (cancel, reject)."""

    @click.command(name, help=about)
    @click.argument("action_id")
    @SCOPE
    @REASON
    @run
    async def command(ctx: Context, box: Outbox, action_id: str, scope: str | None, reason: str) -> None:
        from ... import operations

        intent = await getattr(operations, name)(box, action_id, _operator(reason), scope=scope)
        ctx.emit(shapes().intent_json(intent), f"{done} {action_id}")

    return command


cancel = _with_reason("cancel", "cancelled", "Withdraw an intent that is not being sent right now.")


@click.command()
@click.argument("action_id")
@click.option("--digest", required=True, help="The payload_digest you reviewed (see `outbox show`).")
@click.option("--valid-seconds", type=float, default=3600, show_default=True, help="How long the approval lasts.")
@SCOPE
@REASON
@run
async def approve(ctx: Context, box: Outbox, action_id: str, digest: str, valid_seconds: float,
                  scope: str | None, reason: str) -> None:
    """Approve a held intent's exact payload, for a limited time."""
    from ... import operations
    from ...clock import iso

    intent = await operations.approve(box, action_id, _operator(reason), payload_digest=digest,
                                      valid_seconds=valid_seconds, scope=scope)
    ctx.emit(shapes().intent_json(intent), f"approved {action_id} until {iso(intent.approval_expires_at)}")


reject = _with_reason("reject", "rejected", "Refuse a held intent; it is never sent.")


@click.command()
@click.option("--older-than-days", type=float, help="Default: the retention setting (7 days).")
@click.option("--dry-run", is_flag=True, help="List what would go, delete nothing.")
@run
async def prune(ctx: Context, box: Outbox, older_than_days: float | None, dry_run: bool) -> None:
    """Delete delivered and cancelled intents past their retention (dead and unknown stay)."""
    from datetime import timedelta

    from ... import operations

    age = timedelta(days=older_than_days) if older_than_days is not None else \
        timedelta(seconds=box.settings.delivered_retention_seconds)
    gone = await operations.prune(box, older_than=age, dry_run=dry_run)
    ctx.emit({"dry_run": dry_run, "pruned": len(gone), "action_ids": gone},
             f"{'would prune' if dry_run else 'pruned'} {len(gone)} intent(s)")
