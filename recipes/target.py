"""Where a recipe's model calls go, and the one factory that builds its models.

A recipe never names a model class. It asks a :class:`ModelFactory` for a chat model or a
completion model with a given output length, and gets ``ChatEclectus`` / ``EclectusLLM``
(Eclectus mode) or langchain_openai's ``ChatOpenAI`` / ``OpenAI`` pointed at ``base_url``
(openai mode), built from the same arguments. :meth:`ModelFactory.prepare` is the one place
where the modes differ in app code: in Eclectus mode it wraps a chain with the chain
compiler (``compile``), falling back to the plain chain when compiling fails.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel, BaseLLM
from langchain_core.runnables import Runnable, RunnableConfig

log = logging.getLogger(__name__)

Backend = Literal["eclectus", "openai"]


@dataclass(frozen=True, slots=True)
class Target:
    """One server to run against.

    ``backend`` "eclectus": ``url`` is the server's ``ws://`` URL. "openai": ``url`` is an
    OpenAI-compatible base URL (``http://host:port/v1``). ``metrics_url`` is an Eclectus
    server's ``http://host:port/metrics`` (both modes, when the server is Eclectus); None
    for a foreign server, whose calls are then counted on the client.
    """

    backend: Backend
    url: str
    model: str = "tiny"
    api_key: str | None = None
    metrics_url: str | None = None
    use_compile: bool = True  # Eclectus mode only: wrap chains with compile()

    def __post_init__(self) -> None:
        if self.backend not in ("eclectus", "openai"):
            raise ValueError(f"backend must be 'eclectus' or 'openai', got {self.backend!r}")


@dataclass(slots=True)
class ModelFactory:
    """Builds the recipe's models for a target; greedy by default so runs are repeatable.

    ``ignore_eos`` makes every call generate exactly its ``max_tokens`` (as the paper's
    workloads do), so timings compare like with like. ``notes`` collects what fell back
    (mutated by :meth:`prepare`'s wrappers).
    """

    target: Target
    temperature: float = 0.0
    ignore_eos: bool = True
    notes: list[str] = field(default_factory=list)
    # Eclectus mode: what the scheduler optimizes these models' calls for. A stock
    # OpenAI-compatible server has no way to hear it, so openai mode drops it.
    criteria: Literal["latency", "throughput"] = "latency"
    # Eclectus mode: the application (session) these models' calls and compiled chains run
    # as; None: the chain's name. The load eval gives every program instance its own.
    app: str | None = None
    # openai mode: vLLM's request ``priority`` (lower first; its --scheduling-policy
    # priority), sent with every call; None: none sent
    priority: int | None = None

    def for_objective(self, criteria: Literal["latency", "throughput"]) -> ModelFactory:
        """The same factory for work with another objective (shares ``notes``)."""
        return dataclasses.replace(self, criteria=criteria)

    @property
    def backend(self) -> Backend:
        return self.target.backend

    def chat(self, max_tokens: int) -> BaseChatModel:
        """A chat model generating at most ``max_tokens`` per call (pure)."""
        if self.backend == "eclectus":
            from eclectus.adapters.langchain import ChatEclectus

            return ChatEclectus(**self._eclectus_args(max_tokens))
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(**self._openai_args(max_tokens))

    def structured_chat(self, max_tokens: int, schema: dict[str, Any]) -> Runnable:
        """A chat model whose reply is ``schema``'s JSON, parsed (``with_structured_output``)
        (pure). It never ignores EOS: the reply ends where its JSON does, whereas vLLM with
        ``ignore_eos`` goes on generating past the closed JSON up to ``max_tokens``, and
        langchain-openai then refuses the reply."""
        model = dataclasses.replace(self, ignore_eos=False).chat(max_tokens)
        return model.with_structured_output(schema)

    def llm(self, max_tokens: int) -> BaseLLM:
        """A completion model generating at most ``max_tokens`` per call (pure)."""
        if self.backend == "eclectus":
            from eclectus.adapters.langchain import EclectusLLM

            return EclectusLLM(**self._eclectus_args(max_tokens))
        from langchain_openai import OpenAI

        return OpenAI(**self._openai_args(max_tokens))

    def prepare(self, chain: Runnable, name: str, app: str | None = None) -> Runnable:
        """``chain`` as the app runs it: compiled in Eclectus mode (when enabled and the
        compiler loads), unchanged otherwise. ``name`` labels fallback notes; the compiled
        chain runs as the factory's ``app`` when it names one (a load eval's instance: all its
        parts in it), else as ``app``, else as ``name``: parts of one app that share it share
        one session, so its setup is paid once (pure)."""
        if self.backend != "eclectus" or not self.target.use_compile:
            return chain
        try:
            from eclectus.adapters.langchain.compiler import compile as compile_chain

            compiled = compile_chain(chain, app=self.app or app or name)
        except Exception as exc:  # the compiler is optional: the drop-in model still works
            self._note(f"{name}: compile unavailable ({type(exc).__name__}: {exc})")
            return chain
        return _CompiledOrPlain(
            compiled,
            chain,
            lambda exc: self._note(
                f"{name}: compiled run failed, ran the plain chain ({type(exc).__name__}: {exc})"
            ),
        )

    def prepare_function(self, fn: Any, name: str, app: str | None = None) -> Any:
        """``fn`` (a plain app function) as the recipe runs it: compiled by the Python
        evaluator in Eclectus mode (unless compiling is off), unchanged otherwise (pure).
        A compiled function has ``last_frames``: the client frames its last call sent."""
        if self.backend != "eclectus" or not self.target.use_compile:
            return fn
        from eclectus.adapters.langchain.compiler import compile as compile_function

        return compile_function(fn, app=app or name)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            log.warning("%s", text)
            self.notes.append(text)

    def _eclectus_args(self, max_tokens: int) -> dict[str, Any]:
        kwargs = {"ignore_eos": True} if self.ignore_eos else {}
        return dict(
            model=self.target.model,
            base_url=self.target.url,
            api_key=self.target.api_key,
            temperature=self.temperature,
            max_tokens=max_tokens,
            model_kwargs=kwargs,
            criteria=self.criteria,
            app=self.app,
        )

    def _openai_args(self, max_tokens: int) -> dict[str, Any]:
        extra: dict[str, Any] = {"ignore_eos": True} if self.ignore_eos else {}  # vLLM's
        if self.priority is not None:
            extra["priority"] = self.priority
        return dict(
            model=self.target.model,
            base_url=self.target.url,
            api_key=self.target.api_key or "EMPTY",
            temperature=self.temperature,
            max_tokens=max_tokens,
            extra_body=extra or None,
            max_retries=0,
        )


class _CompiledOrPlain(Runnable[Any, Any]):
    """Runs the compiled chain; if it raises, reports why and runs the plain chain.

    A compiled run that failed part-way may already have made calls; the plain run repeats
    them, so the counts of such a run are not comparable (the note says so).
    """

    def __init__(self, compiled: Runnable, plain: Runnable, on_fallback: Any) -> None:
        self.compiled = compiled
        self.plain = plain
        self.on_fallback = on_fallback

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        try:
            return self.compiled.invoke(input, config, **kwargs)
        except Exception as exc:
            self.on_fallback(exc)
            return self.plain.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        try:
            return await self.compiled.ainvoke(input, config, **kwargs)
        except Exception as exc:
            self.on_fallback(exc)
            return await self.plain.ainvoke(input, config, **kwargs)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """The compiled chain's stream; the plain chain's if the compiled one fails before
        its first chunk (after it, the failure is raised: chunks cannot be taken back)."""
        started = False
        try:
            async for chunk in self.compiled.astream(input, config, **kwargs):
                started = True
                yield chunk
        except Exception as exc:
            if started:
                raise
            self.on_fallback(exc)
            async for chunk in self.plain.astream(input, config, **kwargs):
                yield chunk

    def batch(
        self,
        inputs: list[Any],
        config: Any = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        try:
            return self.compiled.batch(inputs, config, **kwargs)
        except Exception as exc:
            self.on_fallback(exc)
            return self.plain.batch(inputs, config, **kwargs)
