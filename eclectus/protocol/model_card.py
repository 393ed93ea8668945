"""What a server says about a model it serves: one type for the engine, the wire and clients."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eclectus.protocol.tool_formats import ToolFormatName, detect_tool_format


class ModelCard(BaseModel):
    """A served model. ``name``: the name clients use (``--served-model-name``; a call naming
    another model is refused). ``context_window``: prompt plus output tokens, at most.
    ``chat_template``: the model's effective Jinja chat template source (None: unknown,
    clients use the default); ``template_vars``: the special-token strings templates use
    (``bos_token``, ``eos_token``...). ``max_output_tokens``: a cap on one output below the
    context window, when the server has one. ``tool_call_format``: how the model writes tool
    calls (eclectus.protocol.tool_formats; ``eclectus serve --tool-call-parser``); a card
    without it (an older server's) gets its chat template's format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    context_window: int = Field(ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    eos_token_id: int | None = None
    chat_template: str | None = None
    template_vars: dict[str, str] = Field(default_factory=dict)
    tool_call_format: ToolFormatName = "hermes"

    @model_validator(mode="before")
    @classmethod
    def _detect_tool_call_format(cls, data: Any) -> Any:
        # an absent format is the template's (what the server detects too), not "hermes"
        if isinstance(data, dict) and data.get("tool_call_format") is None:
            return {**data, "tool_call_format": detect_tool_format(data.get("chat_template"))}
        return data

    def named(self, name: str) -> ModelCard:
        """This card under another served name (pure)."""
        return self.model_copy(update={"name": name})

    def with_tool_call_format(self, name: ToolFormatName | None) -> ModelCard:
        """This card with its calls read as ``name`` (None: unchanged) (pure); ValueError
        for an unknown format."""
        if name is None:
            return self
        return ModelCard.model_validate({**self.model_dump(), "tool_call_format": name})
