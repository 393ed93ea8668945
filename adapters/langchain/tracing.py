"""The configure hook: lets an eager model call see its prompt template's boundaries.

LangChain calls the prompt template and the model as separate runs, so by the time the model
runs, its prompt is flat text. This handler, registered with
``register_configure_hook`` and active in every callback manager, watches prompt runs: when
one ends, it splits the rendered prompt into pieces (constant template text, variable values)
with the same functions the compiler uses, checks that the pieces concatenate to exactly the
rendered text, and remembers them by that text. The model then sends the pieces as segments
(exact prefix sharing) whenever its prompt text matches.

It also remembers each run's root chain, so a model can tag its session with the name of the
application (the outermost chain) it runs in.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.load import load
from langchain_core.messages import BaseMessage
from langchain_core.prompt_values import ChatPromptValue, StringPromptValue
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.tracers.context import register_configure_hook

from eclectus.adapters.langchain.chat_format import message_text, render_buffer
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.pieces import Piece, Value, concrete_text
from eclectus.adapters.langchain.prompts import chat_prompt_messages, string_prompt_pieces

MAX_REMEMBERED = 4096  # rendered texts kept; old ones are forgotten first (LRU)


class PromptTracer(BaseCallbackHandler):
    """Remembers the pieces of recently rendered prompts and the root chain of live runs.

    Thread-safe: one instance serves every chain in the process.
    """

    run_inline = True  # called in order, on the caller's thread: the model reads right after

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[UUID, tuple[Any, dict[str, Any]]] = {}
        self._text_to_pieces: OrderedDict[str, list[Piece]] = OrderedDict()
        self._run_to_root: dict[UUID, str] = {}
        self._templates: dict[int, tuple[dict[str, Any], Any]] = {}

    # -- what models ask ---------------------------------------------------------------

    def pieces_for(self, text: str) -> list[Piece] | None:
        """The pieces a template rendered ``text`` from, or None (pure lookup)."""
        with self._lock:
            return self._text_to_pieces.get(text)

    def message_pieces(self, messages: Sequence[BaseMessage]) -> list[list[Piece]]:
        """For each message, its template pieces if known, else its text as one value piece
        (a message's content is a variable value of the chat template: the compiler cuts
        the prompt at the same place)."""
        out: list[list[Piece]] = []
        for message in messages:
            text = message_text(message)
            out.append(self.pieces_for(text) or [Value(text)])
        return out

    def app_of(self, run_id: UUID | None) -> str | None:
        """The name of the root chain a run belongs to, if it is nested in a chain."""
        with self._lock:
            return self._run_to_root.get(run_id) if run_id else None

    # -- callbacks (mutate the tables) ---------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._track(run_id, parent_run_id, kwargs.get("name"))
        if serialized and kwargs.get("run_type") == "prompt" and isinstance(inputs, dict):
            with self._lock:
                self._pending[run_id] = (serialized, inputs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            pending = self._pending.pop(run_id, None)
            self._run_to_root.pop(run_id, None)
        if pending is not None:
            self._remember(*pending, outputs)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._pending.pop(run_id, None)
            self._run_to_root.pop(run_id, None)

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._track(run_id, parent_run_id, None)

    def on_llm_start(
        self,
        serialized: Any,
        prompts: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._track(run_id, parent_run_id, None)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._run_to_root.pop(run_id, None)

    on_llm_error = on_chain_error

    # -- internals -----------------------------------------------------------------------

    def _track(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        """A nested run inherits its parent's root; a root chain is its own (by name)."""
        with self._lock:
            if parent_run_id is None:
                if name:
                    self._run_to_root[run_id] = name
            elif parent_run_id in self._run_to_root:
                self._run_to_root[run_id] = self._run_to_root[parent_run_id]

    def _remember(self, serialized: dict[str, Any], inputs: dict[str, Any], output: Any) -> None:
        template = self._revive(serialized)
        try:
            if isinstance(template, PromptTemplate) and isinstance(output, StringPromptValue):
                found = [(output.text, string_prompt_pieces(template, inputs))]
            elif isinstance(template, ChatPromptTemplate) and isinstance(output, ChatPromptValue):
                rendered = chat_prompt_messages(template, inputs)
                if len(rendered) != len(output.messages):
                    return
                found = [
                    (message_text(m), pieces)
                    for m, (_, _, pieces) in zip(output.messages, rendered, strict=True)
                ]
                # a completion model receives the whole chat prompt as Role: lines
                found.append((output.to_string(), render_buffer(rendered)))
            else:
                return
        except (NotLowerable, KeyError, ValueError):
            return  # the model sends the flat text, which is always right
        with self._lock:
            for text, pieces in found:
                if concrete_text(pieces) == text:  # exactness: never send different text
                    self._text_to_pieces[text] = pieces
                    self._text_to_pieces.move_to_end(text)
            while len(self._text_to_pieces) > MAX_REMEMBERED:
                self._text_to_pieces.popitem(last=False)

    def _revive(self, serialized: dict[str, Any]) -> Any:
        """The template object behind a prompt run's serialized form (cached by identity:
        LangChain caches the serialized dict on the template)."""
        with self._lock:
            hit = self._templates.get(id(serialized))
        if hit is not None and hit[0] is serialized:
            return hit[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                # The dict is the in-process template's own dumpd (LangChain passes it with
                # the prompt run), not outside data, so reviving a jinja2 template here is
                # no more trusting than the app already is: the default validator is off.
                template = load(serialized, allowed_objects="core", init_validator=None)
            except Exception:  # an unloadable template only costs the boundaries
                template = None
        with self._lock:
            if len(self._templates) > MAX_REMEMBERED:
                self._templates.clear()
            self._templates[id(serialized)] = (serialized, template)
        return template


TRACER = PromptTracer()
# A ContextVar whose default is the tracer makes the hook active everywhere, with no setup.
_TRACER_VAR: ContextVar[PromptTracer | None] = ContextVar("eclectus_prompt_tracer", default=TRACER)
register_configure_hook(_TRACER_VAR, inheritable=True)


def disable_in_context() -> None:
    """Turns the hook off for the current context (and tasks started from it)."""
    _TRACER_VAR.set(None)
