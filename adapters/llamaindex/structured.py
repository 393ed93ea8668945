"""Structured output for ``Eclectus``: a Pydantic object valid by construction.

LlamaIndex's default ``structured_predict`` asks the model for JSON in the prompt and parses
what comes back (or, for a function-calling LLM, forces a tool call); a small model's answer
may not parse. Here the output is constrained to the class's JSON Schema by the server's
grammar (``SamplingParams.structured_outputs``), so it always validates:
:class:`JsonSchemaProgram` is the program ``structured_predict``, ``astructured_predict``,
``stream_structured_predict`` and ``astream_structured_predict`` run, and so
``as_structured_llm`` (LlamaIndex's ``StructuredLLM`` calls them) too.

The prompt is not changed: the schema reaches the model through the constraint only, as with
OpenAI's ``response_format``; say in the prompt what the fields mean. A chat prompt template
is sent as chat messages, any other template as segments (prompt capture, :mod:`.capture`).
Setting ``pydantic_program_mode`` to anything but DEFAULT gives LlamaIndex's own program.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable
from typing import Any, Generic

import llama_index.core.instrumentation as instrument
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.program.utils import FlexibleModel, create_flexible_model
from llama_index.core.prompts import BasePromptTemplate, ChatPromptTemplate
from llama_index.core.types import BasePydanticProgram, Model, PydanticProgramMode
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from eclectus.adapters.llamaindex.capture import CapturingLLM
from eclectus.protocol.structured import StructuredOutputs

dispatcher = instrument.get_dispatcher(__name__)


def json_constraint(output_cls: type[BaseModel]) -> StructuredOutputs:
    """The constraint holding an output to ``output_cls``'s JSON Schema (pure)."""
    return StructuredOutputs(json=output_cls.model_json_schema())


class JsonSchemaProgram(BasePydanticProgram[Model], Generic[Model]):
    """``prompt`` run on ``llm`` with its output held to ``output_cls``'s schema, parsed.
    Stateless between calls."""

    def __init__(
        self, llm: CapturingLLM, output_cls: type[Model], prompt: BasePromptTemplate
    ) -> None:
        self._llm = llm
        self._output_cls = output_cls
        self._prompt = prompt
        self._constraint = json_constraint(output_cls)

    @property
    def output_cls(self) -> type[Model]:
        return self._output_cls

    def _kwargs(self, llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        return {**(llm_kwargs or {}), "structured_outputs": self._constraint}

    def __call__(self, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        """One call; the parsed object (mutates only the session: a call is made)."""
        kwargs = self._kwargs(llm_kwargs)
        if isinstance(self._prompt, ChatPromptTemplate):
            messages = self._prompt.format_messages(llm=self._llm, **prompt_args)
            text = self._llm.chat(messages, **kwargs).message.content or ""
        else:
            prompt, build = self._llm.template_request(self._prompt, prompt_args, kwargs)
            text = self._llm._complete_captured(prompt, build).text
        return self._output_cls.model_validate_json(text)

    async def acall(self, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        """Async twin of ``__call__``."""
        kwargs = self._kwargs(llm_kwargs)
        if isinstance(self._prompt, ChatPromptTemplate):
            messages = self._prompt.format_messages(llm=self._llm, **prompt_args)
            text = (await self._llm.achat(messages, **kwargs)).message.content or ""
        else:
            prompt, build = self._llm.template_request(self._prompt, prompt_args, kwargs)
            text = (await self._llm._acomplete_captured(prompt, build)).text
        return self._output_cls.model_validate_json(text)

    def stream_call(
        self, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> Generator[Model | FlexibleModel, None, None]:
        """Partial objects (a FlexibleModel of the fields so far) as the JSON grows, then
        the parsed object."""
        kwargs = self._kwargs(llm_kwargs)
        if isinstance(self._prompt, ChatPromptTemplate):
            messages = self._prompt.format_messages(llm=self._llm, **prompt_args)
            deltas: Iterable[Any] = self._llm.stream_chat(messages, **kwargs)
        else:
            prompt, build = self._llm.template_request(self._prompt, prompt_args, kwargs)
            deltas = self._llm._stream_captured(prompt, build)
        partials = PartialObjects(self._output_cls)
        for response in deltas:
            yield from partials.feed(response.delta or "")
        yield partials.finish()

    async def astream_call(  # type: ignore[override]
        self, llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
    ) -> AsyncGenerator[Model | FlexibleModel, None]:
        """Async twin of :meth:`stream_call` (awaited, it returns the generator)."""
        kwargs = self._kwargs(llm_kwargs)
        if isinstance(self._prompt, ChatPromptTemplate):
            messages = self._prompt.format_messages(llm=self._llm, **prompt_args)
            deltas: AsyncIterator[Any] = await self._llm.astream_chat(messages, **kwargs)
        else:
            prompt, build = self._llm.template_request(self._prompt, prompt_args, kwargs)
            deltas = await self._llm._astream_captured(prompt, build)

        async def gen() -> AsyncGenerator[Model | FlexibleModel, None]:
            partials = PartialObjects(self._output_cls)
            async for response in deltas:
                for partial in partials.feed(response.delta or ""):
                    yield partial
            yield partials.finish()

        return gen()


class PartialObjects(Generic[Model]):
    """The JSON text of one object as it streams in, read as partial objects (mutated by
    :meth:`feed`)."""

    def __init__(self, output_cls: type[Model]) -> None:
        self._output_cls = output_cls
        self._flexible = create_flexible_model(output_cls)
        self._text = ""
        self._last: dict[str, Any] | None = None

    def feed(self, delta: str) -> list[FlexibleModel]:
        """The new partial object ``delta`` makes, if the fields so far changed (mutates)."""
        self._text += delta
        try:
            data = from_json(self._text, allow_partial=True)
        except ValueError:
            return []
        if not isinstance(data, dict) or data == self._last:
            return []
        try:
            partial = self._flexible.model_validate(data)
        except ValidationError:
            return []
        self._last = data
        return [partial]

    def finish(self) -> Model:
        """The whole object (ValidationError if the text is not one; it is, when the
        output was constrained and not cut short)."""
        return self._output_cls.model_validate_json(self._text)


class ConstrainedLLM(CapturingLLM):
    """A CapturingLLM whose structured predictions run :class:`JsonSchemaProgram` (the
    constrained path) unless ``pydantic_program_mode`` asks for another program."""

    def _program(
        self, output_cls: type[Model], prompt: BasePromptTemplate
    ) -> JsonSchemaProgram[Model] | None:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return None
        return JsonSchemaProgram(self, output_cls, prompt)

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """``prompt``'s answer as an ``output_cls`` object, valid by construction (makes one
        call)."""
        program = self._program(output_cls, prompt)
        if program is None:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)  # type: ignore[arg-type]
        start = LLMStructuredPredictStartEvent(
            output_cls=output_cls, template=prompt, template_args=prompt_args
        )
        dispatcher.event(start)
        result = program(llm_kwargs=llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """Async twin of :meth:`structured_predict`."""
        program = self._program(output_cls, prompt)
        if program is None:
            return await super().astructured_predict(
                output_cls,
                prompt,  # type: ignore[arg-type]
                llm_kwargs,
                **prompt_args,
            )
        start = LLMStructuredPredictStartEvent(
            output_cls=output_cls, template=prompt, template_args=prompt_args
        )
        dispatcher.event(start)
        result = await program.acall(llm_kwargs=llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    def _structured_stream_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[Any, None, None]:
        # what stream_structured_predict iterates (it emits the events)
        program = self._program(output_cls, prompt)
        if program is None:
            return super()._structured_stream_call(output_cls, prompt, llm_kwargs, **prompt_args)  # type: ignore[arg-type]
        return program.stream_call(llm_kwargs=llm_kwargs, **prompt_args)

    async def _structured_astream_call(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[Any, None]:
        program = self._program(output_cls, prompt)
        if program is None:
            return await super()._structured_astream_call(
                output_cls,
                prompt,  # type: ignore[arg-type]
                llm_kwargs,
                **prompt_args,
            )
        return await program.astream_call(llm_kwargs=llm_kwargs, **prompt_args)
