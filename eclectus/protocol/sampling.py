"""How one output is generated: the one sampling type every layer uses.

The wire (a ``gen`` segment's ``sampling``), the SDK, the LangChain and LlamaIndex adapters,
the OpenAI endpoint and the engine all take this model as it is; nothing converts it into a
second type. Every field is range-checked here, at the edge, so a value that would overflow
the engine (``top_k = 2**70``, ``seed = 2**80``) is refused with a message naming the field
before it reaches a batch shared with other sessions.

A new option is added once: a field here, its use in the engine's sampler or output
processor, and a row in docs/protocol.md (docs/architecture.md says where each layer picks
it up).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eclectus.protocol.structured import StructuredOutputs

# The defaults a user of OpenAI / vLLM expects, stated once (docs/protocol.md has the table):
# ``max_tokens`` None generates until EOS or the context window, as chat completions do;
# the legacy ``/v1/completions`` endpoint documents 16 when the request names none.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

MAX_STOP_STRINGS = 16
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed
MAX_TOP_K = 2**31 - 1  # any vocabulary; the sampler clamps to the real one


class SamplingParams(BaseModel):
    """How to pick each next token and when to stop.

    ``max_tokens`` None: until an end-of-sequence token or the context window. temperature 0
    is greedy. ``top_k`` -1 and ``top_p`` 1.0 switch those filters off. ``seed`` makes a
    sampled request reproducible on its own, whatever else is in the batch. ``stop`` strings
    are matched on the decoded text and are not part of the output; ``stop_token_ids`` end the
    request after that token (also not part of the text). ``ignore_eos`` keeps generating
    past the end-of-sequence token until ``max_tokens`` or the context window.
    ``structured_outputs`` (vLLM's name and shape: one of ``json``, ``json_object``,
    ``regex``, ``choice``, ``grammar``) constrains the text by construction: the engine masks
    every token the grammar does not allow, and the request ends when the grammar does.
    ``skip_special_tokens`` (vLLM's name and default) leaves special tokens' text out of the
    output text; vLLM turns it off for chat requests with tools (its hermes parser), and
    /v1 does the same.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1, le=MAX_TOP_K)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: tuple[str, ...] = Field(default=(), max_length=MAX_STOP_STRINGS)
    stop_token_ids: tuple[int, ...] = Field(default=(), max_length=MAX_STOP_STRINGS)
    ignore_eos: bool = False
    structured_outputs: StructuredOutputs | None = None
    skip_special_tokens: bool = True

    @field_validator("top_k")
    @classmethod
    def _top_k_on_or_off(cls, top_k: int) -> int:
        if top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return top_k

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, stop: object) -> object:
        return (stop,) if isinstance(stop, str) else stop  # OpenAI accepts one string too

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, stop: tuple[str, ...]) -> tuple[str, ...]:
        if any(not s for s in stop):
            raise ValueError("a stop string must not be empty")
        return stop

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
