"""What a server says about a model it serves: one type for the engine, the wire and clients."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelCard(BaseModel):
    """A served model. ``name``: the name clients use (``--served-model-name``; a call naming
    another model is refused). ``context_window``: prompt plus output tokens, at most.
    ``chat_template``: the model's effective Jinja chat template source (None: unknown,
    clients use the default); ``template_vars``: the special-token strings templates use
    (``bos_token``, ``eos_token``...). ``max_output_tokens``: a cap on one output below the
    context window, when the server has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    context_window: int = Field(ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    eos_token_id: int | None = None
    chat_template: str | None = None
    template_vars: dict[str, str] = Field(default_factory=dict)

    def named(self, name: str) -> ModelCard:
        """This card under another served name (pure)."""
        return self.model_copy(update={"name": name})
