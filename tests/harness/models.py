"""A scripted model for the harness tests (Pydantic AI's ``FunctionModel``, no model service):
it makes the given tool calls in its first response, then answers with what each call's result
told it, as JSON text, so a test reads exactly what the model was told."""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def told(messages: list[ModelMessage]) -> dict[str, Any]:
    """Every tool result the model has read, by tool call id: its outcome and content."""
    return {part.tool_call_id: {"outcome": part.outcome, "content": part.model_response_object()}
            for message in messages for part in message.parts if isinstance(part, ToolReturnPart)}


def calling(*calls: tuple[str, str, dict[str, Any]]) -> FunctionModel:
    """A model whose first response calls each ``(tool, tool_call_id, args)``; once every call
    has a result it says what it was told."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=id_) for tool, id_, args in calls])
        return ModelResponse(parts=[TextPart(json.dumps(told(messages), sort_keys=True))])

    return FunctionModel(respond)
