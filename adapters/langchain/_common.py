"""What ChatEclectus and EclectusLLM share: constructor fields and the sampling payload.

Field names and aliases follow ``langchain_openai`` (``model``/``model_name``,
``api_key``, ``base_url``, ``timeout``, ``stop``/``stop_sequences``, ``model_kwargs``), so a
LangChain app swaps its import and keeps its arguments. One payload builder serves every
entry point (invoke, stream, batch, async twins, and the chain compiler).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

from langchain_core.utils import secret_from_env
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from eclectus.adapters.calls import DEFAULT_MAX_RETRIES, CallOptions
from eclectus.adapters.client.connect import TOKEN_ENV
from eclectus.adapters.connection import default_url
from eclectus.adapters.langchain import tracing
from eclectus.adapters.sampling import SAMPLING_KEYS, build_sampling, explicit
from eclectus.protocol import SamplingParams

# The named sampling fields; every other contract field (``ignore_eos``, ``stop_token_ids``,
# any added later) is taken from ``model_kwargs`` or a call-time keyword.
NAMED_SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed")
# OpenAI arguments an app may pass that change nothing at these values; any other value
# is refused rather than silently ignored.
NEUTRAL_OPENAI_KWARGS: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "logprobs": None,
    "logit_bias": None,
    "stream_usage": True,
}
# Constructor names of langchain_openai that map onto ours.
OPENAI_FIELD_RENAMES = {
    "openai_api_key": "api_key",
    "openai_api_base": "base_url",
    "max_completion_tokens": "max_tokens",
}
# Call-time keys LangChain itself passes along that are not sampling parameters.
_IGNORED_CALL_KEYS = frozenset({"stream", "model", "ls_structured_output_format"})


class EclectusParams(BaseModel):
    """Constructor fields shared by the chat model and the completion model."""

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    # whether the model's prompts are a chat template's render (ChatEclectus): those are sent
    # with add_special_tokens false, as vLLM's chat endpoint tokenizes them
    renders_chat: ClassVar[bool] = False

    model_name: str | None = Field(default=None, alias="model")
    """Server model to use; None means the server's default model."""
    temperature: float | None = None
    """Sampling temperature (0: greedy). None: the server's default (greedy)."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most tokens to generate per call. None: until the end-of-sequence token or the
    context window (as ChatOpenAI against vLLM; docs/protocol.md, "Defaults")."""
    top_p: float | None = None
    """Nucleus sampling probability mass."""
    top_k: int | None = None
    """Top-k sampling (vLLM's ``top_k``); -1 or None: off."""
    seed: int | None = None
    """Sampling seed, for reproducible non-greedy output."""
    stop: list[str] | str | None = Field(default=None, alias="stop_sequences")
    """Stop sequences: generation ends before the first one produced."""
    streaming: bool = False
    """Stream by default (``invoke`` then goes through the streaming path)."""
    request_timeout: float | None = Field(default=None, alias="timeout")
    """Seconds to wait for one call's result, or for each delta of a stream. None: no
    limit."""
    max_retries: int | None = DEFAULT_MAX_RETRIES
    """How many times a call is retried after a lost connection."""
    eclectus_api_key: SecretStr | None = Field(
        alias="api_key", default_factory=secret_from_env(TOKEN_ENV, default=None)
    )
    """Auth token for the server's ``hello``. Default: env ECLECTUS_TOKEN."""
    eclectus_url: str = Field(alias="base_url", default_factory=default_url)
    """Server URL (``ws://`` or ``http://``). Default: env ECLECTUS_URL, else local."""
    criteria: Literal["latency", "throughput", "deadline"] = "latency"
    """The objective of this model's calls for the server's scheduler: ``latency`` (a user
    waits for the answer), ``throughput`` (background work that may wait) or ``deadline``
    (answer within ``deadline_ms``). It flows upstream through a compiled graph."""
    deadline_ms: float | None = Field(default=None, gt=0)
    """With ``criteria="deadline"``: milliseconds from the request to the answer."""
    app_name: str | None = Field(default=None, alias="app")
    """Application tag for the session. None: the enclosing chain's name, if any."""
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Further sampling keys (any field of the contract's SamplingParams, e.g.
    ``ignore_eos``, ``stop_token_ids``); unknown constructor kwargs land here too."""

    @model_validator(mode="before")
    @classmethod
    def _gather_extra(cls, values: Any) -> Any:
        """Map OpenAI-only names onto ours and move unknown kwargs into ``model_kwargs``."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        for old, new in OPENAI_FIELD_RENAMES.items():
            if old in values:
                values.setdefault(new, values.pop(old))
        known = {name for name, f in cls.model_fields.items()} | {
            f.alias for f in cls.model_fields.values() if f.alias
        }
        extra = dict(values.get("model_kwargs") or {})
        for key in [k for k in values if k not in known]:
            extra[key] = values.pop(key)
        values["model_kwargs"] = _checked_model_kwargs(extra)
        return values

    @model_validator(mode="after")
    def _options_fit(self) -> EclectusParams:
        """The call options and the sampling settings are checked once, here; and the
        prompt tracer is registered with LangChain (once per process), so the chains this
        model runs in send their templates' boundaries."""
        self.call_options()
        self.sampling(None, {})
        tracing.install()
        return self

    def call_options(self) -> CallOptions:
        """Retries, timeout and objective of every call of this model (pure; ValueError
        when criteria and deadline_ms do not fit together)."""
        return CallOptions(
            max_retries=self.max_retries or 0,
            request_timeout=self.request_timeout,
            criteria=self.criteria,
            deadline_ms=self.deadline_ms,
        )

    @classmethod
    def is_lc_serializable(cls) -> bool:
        """Chains holding these models can be saved with ``dumpd`` and loaded back."""
        return True

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """The import path ``load`` revives the class from (its module)."""
        return cls.__module__.split(".")

    @property
    def lc_secrets(self) -> dict[str, str]:
        """The token is serialized as a reference to ECLECTUS_TOKEN, never as its value."""
        return {"eclectus_api_key": "ECLECTUS_TOKEN"}

    @property
    def token(self) -> str | None:
        """The auth token as plain text (None when unset)."""
        return self.eclectus_api_key.get_secret_value() if self.eclectus_api_key else None

    def sampling(self, stop: list[str] | None, call_kwargs: dict[str, Any]) -> SamplingParams:
        """The contract's SamplingParams for one call: fields, then ``model_kwargs``, then
        call-time kwargs (``.bind``/``invoke``), then ``stop``; later wins, None leaves the
        earlier layer (or the contract's default) in place. Pure; ValueError for a value
        out of range or an argument Eclectus does not support."""
        fields = {key: getattr(self, key) for key in NAMED_SAMPLING_FIELDS}
        calls: dict[str, Any] = {}
        for key, value in call_kwargs.items():
            if key in SAMPLING_KEYS:
                calls[key] = value
            elif key not in _IGNORED_CALL_KEYS and not _is_neutral(key, value):
                raise ValueError(f"{type(self).__name__} does not support argument {key!r}")
        where = type(self).__name__
        return build_sampling(
            fields, {"stop": self.stop}, self.model_kwargs, calls, {"stop": stop}, where=where
        )

    def model_for(self, call_kwargs: dict[str, Any]) -> str | None:
        """The model a call runs on: a call-time ``model`` overrides the field. Pure."""
        return call_kwargs.get("model") or self.model_name

    def ls_params(self, stop: list[str] | None, call_kwargs: dict[str, Any]) -> dict[str, Any]:
        """LangSmith's standard parameters for ``_get_ls_params``. Pure."""
        stop = stop or call_kwargs.get("stop") or self.stop
        params: dict[str, Any] = {
            "ls_provider": "eclectus",
            "ls_model_name": self.model_for(call_kwargs) or "default",
            "ls_temperature": call_kwargs.get("temperature", self.temperature),
        }
        max_tokens = call_kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop:
            params["ls_stop"] = [stop] if isinstance(stop, str) else list(stop)
        return params

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """The parameters that tell two configurations apart (for caching keys). Pure."""
        return {
            "model_name": self.model_name,
            "base_url": self.eclectus_url,
            **explicit(self.sampling(None, {})),
        }


def _is_neutral(key: str, value: Any) -> bool:
    return key in NEUTRAL_OPENAI_KWARGS and value == NEUTRAL_OPENAI_KWARGS[key]


def _checked_model_kwargs(extra: dict[str, Any]) -> dict[str, Any]:
    """Keep the sampling keys, drop neutral OpenAI ones, refuse the rest (pure)."""
    kept: dict[str, Any] = {}
    for key, value in extra.items():
        if key in SAMPLING_KEYS:
            kept[key] = value
        elif _is_neutral(key, value):
            warnings.warn(f"{key}={value!r} has no effect on Eclectus; ignored", stacklevel=4)
        else:
            raise ValueError(f"unsupported argument {key}={value!r} for an Eclectus model")
    return kept
