"""The configure hook: lets an eager model call see its prompt template's boundaries.

LangChain calls the prompt template and the model as separate runs, so by the time the model
runs, its prompt is flat text. This handler, registered with ``register_configure_hook``
when the first Eclectus model is constructed (:func:`install`; importing registers nothing)
and from then on active in every callback manager, watches prompt runs: when
one ends, it splits the rendered prompt into pieces (constant template text, variable values)
with the same functions the compiler uses, checks that the pieces concatenate to exactly the
rendered text, and remembers them by that text, within the run tree (the outermost run and
everything nested in it) the prompt ran in. A model run in the same tree then sends the pieces
as segments (the seams prefix pins use) whenever its prompt text matches. The memory is per tree
and dropped when the tree's root run ends: another application (or a later run of the same
one, or one running at the same time on another thread or task) never sees a template it did
not render, so the same text typed by a user stays a variable value.

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

MAX_REMEMBERED = 4096  # rendered texts kept per run tree; old ones are forgotten first (LRU)
MAX_TREES = 1024  # live run trees with remembered texts (a root that never ends is evicted)


class PromptTracer(BaseCallbackHandler):
    """Remembers the pieces of the prompts rendered in each live run tree and the root chain
    of live runs.

    Thread-safe: one instance serves every chain in the process; run trees never share what
    they remember.
    """

    run_inline = True  # called in order, on the caller's thread: the model reads right after

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[UUID, tuple[Any, dict[str, Any]]] = {}
        self._tree_of: dict[UUID, UUID] = {}  # live run -> its tree's root run
        # root run -> rendered text -> pieces, for the trees that rendered a prompt
        self._texts: OrderedDict[UUID, OrderedDict[str, list[Piece]]] = OrderedDict()
        self._run_to_root: dict[UUID, str] = {}
        self._templates: dict[int, tuple[dict[str, Any], Any]] = {}

    # -- what models ask ---------------------------------------------------------------

    def pieces_for(self, text: str, run_id: UUID | None) -> list[Piece] | None:
        """The pieces a template rendered ``text`` from in the run tree of ``run_id`` (a
        live run: the model's own, or its parent's), or None (pure lookup). Outside a
        traced run (``run_id`` None or unknown) nothing is known."""
        with self._lock:
            root = self._tree_of.get(run_id) if run_id else None
            texts = self._texts.get(root) if root else None
            return texts.get(text) if texts else None

    def message_pieces(
        self, messages: Sequence[BaseMessage], run_id: UUID | None
    ) -> list[list[Piece]]:
        """For each message, its template pieces if known in ``run_id``'s tree, else its
        text as one value piece (a message's content is a variable value of the chat
        template: the compiler cuts the prompt at the same place)."""
        out: list[list[Piece]] = []
        for message in messages:
            text = message_text(message)
            out.append(self.pieces_for(text, run_id) or [Value(text)])
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
            root = self._tree_of.get(run_id)
        if pending is not None and root is not None:
            self._remember(root, *pending, outputs)
        self._end(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            self._pending.pop(run_id, None)
        self._end(run_id)

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
        self._end(run_id)

    on_llm_error = on_chain_error

    # -- internals -----------------------------------------------------------------------

    def _track(self, run_id: UUID, parent_run_id: UUID | None, name: str | None) -> None:
        """A nested run inherits its parent's tree and root name; a run with no (known)
        parent is the root of its own tree, named by its name (mutates)."""
        with self._lock:
            self._tree_of[run_id] = (
                self._tree_of.get(parent_run_id, run_id) if parent_run_id else run_id
            )
            if parent_run_id is None:
                if name:
                    self._run_to_root[run_id] = name
            elif parent_run_id in self._run_to_root:
                self._run_to_root[run_id] = self._run_to_root[parent_run_id]

    def _end(self, run_id: UUID) -> None:
        """Forgets an ended run; a root's end forgets what its tree rendered (mutates)."""
        with self._lock:
            self._run_to_root.pop(run_id, None)
            if self._tree_of.pop(run_id, None) == run_id:
                self._texts.pop(run_id, None)

    def _remember(
        self, root: UUID, serialized: dict[str, Any], inputs: dict[str, Any], output: Any
    ) -> None:
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
            if root not in self._tree_of:  # the tree ended meanwhile (another thread's root)
                return
            texts = self._texts.setdefault(root, OrderedDict())
            self._texts.move_to_end(root)
            for text, pieces in found:
                if concrete_text(pieces) == text:  # exactness: never send different text
                    texts[text] = pieces
                    texts.move_to_end(text)
            while len(texts) > MAX_REMEMBERED:
                texts.popitem(last=False)
            while len(self._texts) > MAX_TREES:
                self._texts.popitem(last=False)

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
# A ContextVar whose default is the tracer makes the hook, once registered, active in every
# callback manager, with no setup.
_TRACER_VAR: ContextVar[PromptTracer | None] = ContextVar("eclectus_prompt_tracer", default=TRACER)
_install_lock = threading.Lock()
_installed = False


def install() -> None:
    """Registers the configure hook with LangChain, once per process (mutates LangChain's
    hook list the first time; idempotent, thread-safe). ``ChatEclectus`` and
    ``EclectusLLM`` call it when constructed, before any chain holding one can run, so
    importing this module (or the package) changes nothing global."""
    global _installed
    with _install_lock:
        if not _installed:
            register_configure_hook(_TRACER_VAR, inheritable=True)
            _installed = True


def config_run_id(config: Any) -> UUID | None:
    """The run a call made with ``config`` (a RunnableConfig, or a batch's list of them)
    nests in: its callback manager's parent run, or None (pure)."""
    first = config[0] if isinstance(config, list) and config else config
    callbacks = first.get("callbacks") if isinstance(first, dict) else None
    return getattr(callbacks, "parent_run_id", None)


def disable_in_context() -> None:
    """Turns the hook off for the current context (and tasks started from it)."""
    _TRACER_VAR.set(None)
