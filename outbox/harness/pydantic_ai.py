"""The outbox as the effect layer of a Pydantic AI agent (the ``pydantic-ai`` extra).

    tools = EffectTools(Effects(Served(url), wait_seconds=2), scope=lambda deps: deps.tenant)

    @tools.tool("billing")
    def send_invoice(invoice: int, amount_cents: int) -> None:
        "Send the customer's invoice."       # the signature and docstring are what the model sees

    agent = Agent(model, toolsets=[tools.toolset], output_type=[str, DeferredToolRequests])

A call of an effect tool enqueues its arguments as an intent (action id from the conversation
and the tool call id) and answers the model at once when the outcome settles within the wait;
otherwise it is deferred (``CallDeferred``), or asks for approval (``ApprovalRequired``) when the
destination holds it, carrying the intent's identities as metadata. ``settle`` answers a run's
``DeferredToolRequests`` exactly from the outbox's record and resumes it; ``recover`` answers the
calls a crash left unanswered in a stored history, by the record or by the recovery policy.
Only Pydantic AI's public API is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic_ai import (
    AgentRunResult,
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    FunctionToolset,
    RunContext,
    ToolApproved,
    ToolDenied,
    ToolFailed,
    ToolReturn,
    WrapperToolset,
)
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolCallPart
from pydantic_ai.toolsets import ToolsetTool

from .actions import METADATA_KEY, Action
from .answers import Answer, ApprovalNeeded, Failed, Pending, Returned, unrecorded
from .effects import Effects
from .recovery import Recovery, runs_again

Deps = TypeVar("Deps")
F = TypeVar("F", bound=Callable[..., Any])
#: What a person decides about a call waiting for approval.
Decision = bool | ToolApproved | ToolDenied
#: What the model reads for each result kind (``ToolReturn`` or ``ToolFailed``), or a run again.
CallResult = ToolReturn | ToolFailed


def result(answer: Returned | Failed) -> CallResult:
    """A settled answer as Pydantic AI's tool result: a return the model reads, or a failure."""
    return ToolReturn(dict(answer.value)) if isinstance(answer, Returned) else ToolFailed(answer.message)


def _raised(answer: Answer, action: Action) -> CallResult:
    """What the tool gives back for ``answer``: the result, or the deferral it raises."""
    if isinstance(answer, ApprovalNeeded):
        raise ApprovalRequired(action.metadata())
    if isinstance(answer, Pending):
        raise CallDeferred(action.metadata())
    return result(answer)


def unanswered(history: Sequence[ModelMessage]) -> list[ToolCallPart]:
    """The tool calls of the history's last response that no later request answers."""
    responses = [i for i, m in enumerate(history) if isinstance(m, ModelResponse)]
    if not responses:
        return []
    last = responses[-1]
    answered = {getattr(part, "tool_call_id", None) for message in history[last + 1:]
                if isinstance(message, ModelRequest) for part in message.parts}
    response = history[last]
    assert isinstance(response, ModelResponse)
    return [call for call in response.tool_calls if call.tool_call_id not in answered]


def conversation_of(history: Sequence[ModelMessage]) -> str:
    """The conversation a stored history belongs to (the last message that names one)."""
    found = next((m.conversation_id for m in reversed(history) if m.conversation_id), None)
    if found is None:
        raise ValueError("the history names no conversation_id, so its calls' action ids cannot be derived")
    return found


class EffectTools(Generic[Deps]):
    """Effect tools bound to one outbox (``effects``), on the authority of ``scope`` (a string, or
    a function of the run's deps). ``retry_safe`` names the agent's other tools that may run
    again after a crash under the ``declared`` policy. Give ``toolset`` to the agent."""

    def __init__(self, effects: Effects, *, scope: str | Callable[[Deps], str], retry_safe: Iterable[str] = ()):
        self.effects = effects
        self.scope = scope
        self.retry_safe = frozenset(retry_safe)
        self.destinations: dict[str, str] = {}
        self.functions: FunctionToolset[Deps] = FunctionToolset()
        self.toolset = EffectToolset(self.functions, tools=self)

    def tool(self, destination: str, *, name: str | None = None) -> Callable[[F], F]:
        """Declare an effect tool sending to ``destination``: the function's signature and
        docstring are the tool the model sees; its body never runs (the call is the intent)."""

        def declare(function: F) -> F:
            tool_name = name or function.__name__
            self.functions.add_function(function, takes_ctx=False, name=tool_name)
            self.destinations[tool_name] = destination
            return function

        return declare

    def scope_of(self, deps: Any) -> str:
        return self.scope if isinstance(self.scope, str) else self.scope(deps)

    def action(self, conversation_id: str, call: ToolCallPart, deps: Any) -> Action:
        """The intent a call of an effect tool stands for."""
        return Action(conversation_id, call.tool_call_id, call.tool_name, self.destinations[call.tool_name],
                      self.scope_of(deps), call.args_as_dict())

    async def call(self, ctx: RunContext[Deps]) -> CallResult:
        """Run one effect tool call: enqueue it, and answer or defer it."""
        call = next(part for message in reversed(ctx.messages) if isinstance(message, ModelResponse)
                    for part in message.tool_calls if part.tool_call_id == ctx.tool_call_id)
        if ctx.conversation_id is None:
            raise ValueError("the run has no conversation_id, so the call's action id cannot be derived")
        action = self.action(ctx.conversation_id, call, ctx.deps)
        return _raised(await self.effects.submit(action), action)

    # -- suspended runs --------------------------------------------------------------------------

    async def results(self, requests: DeferredToolRequests, *, approvals: Mapping[str, Decision] | None = None,
                      calls: Mapping[str, Any] | None = None, wait: float = 0.0,
                      approved_by: str = "harness") -> DeferredToolResults | None:
        """Results matching ``requests`` exactly, one per pending call, or None when any is
        still on its way (the run stays deferred; nothing is resumed).

        Effect calls are answered from the outbox, after waiting up to ``wait`` seconds for the
        first; ``approvals`` (by tool call id) are given or refused in the outbox first, and an
        approval whose arguments differ from those shown raises ArgumentsChanged, approving
        nothing. ``calls`` answers other tools' deferred calls, as Pydantic AI takes them."""
        decided = dict(approvals or {})
        others = dict(calls or {})
        answers = DeferredToolResults()
        missing: list[str] = []
        for call in requests.calls:
            identities = requests.metadata.get(call.tool_call_id, {}).get(METADATA_KEY)
            if identities is None:
                if call.tool_call_id in others:
                    answers.calls[call.tool_call_id] = others[call.tool_call_id]
                else:
                    missing.append(call.tool_call_id)
                continue
            found = await self.effects.outcome(identities["action_id"], identities["scope"], wait=wait)
            wait = 0.0
            if isinstance(found, Pending):
                missing.append(call.tool_call_id)
            elif isinstance(found, ApprovalNeeded):  # its approval lapsed: run it again, to ask for one
                answers.approvals[call.tool_call_id] = ToolApproved()
            else:
                answers.calls[call.tool_call_id] = result(found)
        for call in requests.approvals:
            identities = requests.metadata.get(call.tool_call_id, {}).get(METADATA_KEY)
            decision = decided.get(call.tool_call_id)
            if identities is None:
                if decision is None:
                    missing.append(call.tool_call_id)
                else:
                    answers.approvals[call.tool_call_id] = decision
                continue
            approval = ApprovalNeeded(identities["action_id"], identities["scope"], identities["payload_digest"])
            given = await self._decided(approval, call, identities, decision, approved_by)
            if given is None:
                missing.append(call.tool_call_id)
            else:
                answers.approvals[call.tool_call_id] = given
        return None if missing else answers

    async def _decided(self, approval: ApprovalNeeded, call: ToolCallPart, identities: Mapping[str, str],
                       decision: Decision | None, approved_by: str) -> ToolApproved | ToolDenied | None:
        """Apply a person's decision in the outbox; with none, read what the outbox decided."""
        if decision is True or isinstance(decision, ToolApproved):
            overridden = decision.override_args if isinstance(decision, ToolApproved) else None
            action = Action(identities["conversation_id"], call.tool_call_id, call.tool_name,
                            identities["destination"], approval.scope,
                            call.args_as_dict() if overridden is None else overridden)
            await self.effects.approve(approval, action, reason=f"approved by {approved_by}")
            return ToolApproved()
        if decision is False or isinstance(decision, ToolDenied):
            await self.effects.reject(approval, reason=f"refused by {approved_by}")
            message = decision.message if isinstance(decision, ToolDenied) else "The approval was refused."
            return ToolDenied(f"{message} Nothing was sent.")
        found = await self.effects.backend.find(approval.action_id, approval.scope)
        if found is None or found.status == "held":
            return None
        if found.status == "cancelled":
            return ToolDenied("The approval was refused. Nothing was sent.")
        return ToolApproved()  # approved in the outbox itself: running it again reads the outcome

    async def settle(self, agent: AbstractAgent[Deps, Any], history: Sequence[ModelMessage],
                     requests: DeferredToolRequests, *, deps: Any = None, **decisions: Any,
                     ) -> AgentRunResult[Any] | None:
        """Resume the run that ended with ``requests`` once every pending call has its result
        (see ``results``, which takes the keywords); None while any is still pending."""
        answers = await self.results(requests, **decisions)
        if answers is None:
            return None
        return await agent.run(message_history=list(history), deferred_tool_results=answers, deps=deps)

    # -- after a crash --------------------------------------------------------------------------

    async def recover(self, history: Sequence[ModelMessage], policy: Recovery = Recovery.DECLARED, *,
                      deps: Any = None) -> DeferredToolResults | None:
        """Results for every call a stored history left unanswered (None: there are none), to
        resume it with. An effect call is answered from the outbox's record when it is settled,
        and runs again otherwise (the same intent, so nothing is sent twice); any other call
        runs again or is answered "unknown", as ``policy`` says. Running again is given as an
        approval (``ToolApproved``), the only way Pydantic AI re-runs a pending call."""
        pending = unanswered(history)
        if not pending:
            return None
        answers = DeferredToolResults()
        for call in pending:
            found: Answer | None
            if call.tool_name in self.destinations:
                found = await self.effects.recovered(self.action(conversation_of(history), call, deps), policy)
            else:
                found = None if runs_again(policy, retry_safe=call.tool_name in self.retry_safe) else unrecorded()
            if found is None:
                answers.approvals[call.tool_call_id] = ToolApproved()
            else:
                assert isinstance(found, Returned | Failed)
                answers.calls[call.tool_call_id] = result(found)
        return answers


@dataclass
class EffectToolset(WrapperToolset[Deps]):
    """The effect tools as the agent's toolset: every call goes to ``tools.call``."""

    tools: EffectTools[Deps] = field(kw_only=True)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Deps],
                        tool: ToolsetTool[Deps]) -> Any:
        return await self.tools.call(ctx)

