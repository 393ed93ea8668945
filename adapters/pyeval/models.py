"""Model calls in app code: ``invoke`` / ``ainvoke`` / ``batch`` / ``abatch`` of an Eclectus
model, of an LCEL chain holding one, or of a prompt template, and a template's ``format``.

Each becomes what the chain compiler makes of the runnable (leaves.py, structure.py): a
declared call whose output is symbolic, nothing sent. The input is what the app passes,
with the evaluator's own symbolic values said in the chain compiler's terms: a symbolic
string a model receives directly is its prompt's pieces (so constant text stays its own
segment), one inside a chain's input dict is a server variable (a ``join`` op), a list of
messages with symbolic contents is a chat prompt. ``ainvoke`` and ``abatch`` give a
:class:`Deferred`: awaiting it declares the calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable, RunnableBinding, RunnableSequence

from eclectus.adapters.langchain.chat_format import message_fields, message_role
from eclectus.adapters.langchain.compiler.compile import find_model
from eclectus.adapters.langchain.compiler.leaves import MODEL_TYPES
from eclectus.adapters.langchain.compiler.registry import lowering_for
from eclectus.adapters.langchain.compiler.symbols import SymParsed, SymPrompt
from eclectus.adapters.langchain.errors import NotLowerable
from eclectus.adapters.langchain.pieces import Piece, Ref, Spread, SymMessage, Value
from eclectus.adapters.langchain.prompts import chat_prompt_messages, string_prompt_pieces
from eclectus.adapters.pyeval.operators import is_sym_text, text_of
from eclectus.adapters.pyeval.values import (
    Deferred,
    SymChat,
    SymText,
    is_symbolic,
    make_text,
    text_parts,
)

if TYPE_CHECKING:
    from eclectus.adapters.pyeval.interp import Evaluator

RUN_METHODS = frozenset({"invoke", "ainvoke", "batch", "abatch"})
_ROLES = {
    "human": HumanMessage, "user": HumanMessage, "ai": AIMessage, "assistant": AIMessage,
    "system": SystemMessage,
}  # fmt: skip


def lowerable(runnable: Runnable) -> bool:
    """Whether a call of ``runnable`` lowers: a registered runnable holding an Eclectus
    model, or a prompt template (pure)."""
    if lowering_for(runnable) is None:
        return False
    return isinstance(runnable, PromptTemplate | ChatPromptTemplate) or bool(find_model(runnable))


def run_method(
    ev: Evaluator, runnable: Runnable, method: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """``runnable.method(*args, **kwargs)`` lowered; Python's call (the arguments fetched)
    for a form it does not lower (``return_exceptions``, run kwargs for a chain)."""
    many = method in ("batch", "abatch")
    params = dict(kwargs)
    given = params.pop("inputs" if many else "input", None)
    value = args[0] if args else given
    params.pop("config", None)  # the run's own config carries the callbacks
    if len(args) > 2 or (len(args) == 0 and given is None):
        return _python(ev, runnable, method, args, kwargs)
    if many:
        if params.pop("return_exceptions", False) or params:
            return _python(ev, runnable, method, args, kwargs)
        if type(value) not in (list, tuple) or any(isinstance(v, Spread) for v in value):
            value = ev.concrete(value, f"{method} over a list of unknown length")
        items = list(value)

        def batch() -> list[Any]:
            return ev.host.own([lower_one(ev, runnable, item, {}) for item in items])

        if method == "batch":
            return batch()
        return Deferred(batch, lambda: _python(ev, runnable, method, args, kwargs))
    if params and not _model_of(runnable):
        return _python(ev, runnable, method, args, kwargs)
    if method == "invoke":
        return lower_one(ev, runnable, value, params)
    return Deferred(
        lambda: lower_one(ev, runnable, value, params),
        lambda: _python(ev, runnable, method, args, kwargs),
    )


def lower_one(ev: Evaluator, runnable: Runnable, value: Any, params: dict[str, Any]) -> Any:
    """One lowered call of ``runnable`` on ``value`` (``params``: a model's call kwargs)."""
    host = ev.host
    model = _model_of(runnable)
    if model is not None:
        prompt = model_input(ev, value)
        if prompt is None:
            return _python(ev, runnable, "invoke", [value], params)
        bound = dict(runnable.kwargs) if isinstance(runnable, RunnableBinding) else {}
        return host.lower_model(model, prompt, {**bound, **params})
    if _starts_with_model(runnable):
        prompt = model_input(ev, value)
        if prompt is None:
            return _python(ev, runnable, "invoke", [value], {})
        return host.lower(runnable, prompt)
    return host.lower(runnable, export(ev, value))


def model_input(ev: Evaluator, value: Any) -> Any:
    """What a model receives for ``value``, in the chain compiler's terms: concrete input
    as it is, a symbolic string as a string prompt of its pieces, messages with symbolic
    contents as a chat prompt; None for anything else (the call then runs as Python)."""
    value = ev.host.current(value)
    if not is_symbolic(value):
        return value
    if is_sym_text(ev, value):
        return SymPrompt(text=_pieces(text_of(ev, value) or []))
    if isinstance(value, SymPrompt):
        return value
    if type(value) is list:
        messages = [_prompt_message(ev, m) for m in value]
        if all(m is not None for m in messages):
            return SymPrompt(messages=messages)  # type: ignore[arg-type]
    return None


def _prompt_message(ev: Evaluator, item: Any) -> tuple[type, str, list[Piece]] | None:
    item = ev.host.current(item)
    if isinstance(item, SymMessage):
        return (AIMessage, "assistant", [item.ref])
    if isinstance(item, SymChat):
        return (item.cls, message_role(item.cls(content="")), _pieces(list(item.parts)))
    if isinstance(item, tuple) and len(item) == 2 and item[0] in _ROLES:
        cls = _ROLES[item[0]]
        parts = text_of(ev, ev.host.current(item[1]))
        return (cls, message_role(cls(content="")), _pieces(parts)) if parts else None
    if isinstance(item, str) and not is_symbolic(item):
        return (HumanMessage, "user", [Value(item)])
    plain = isinstance(item, HumanMessage | SystemMessage | AIMessage)
    if plain and isinstance(item.content, str) and not message_fields(item):
        return (type(item), message_role(item), [Value(item.content)])
    return None


def _pieces(parts: list[Any]) -> list[Piece]:
    return [p if isinstance(p, Ref) else Value(p) for p in text_parts(parts)]


def export(ev: Evaluator, value: Any) -> Any:
    """``value`` in the chain compiler's terms: symbolic strings as server variables
    (SymText: a join; a string field: a json_field op), containers rebuilt (pure but for
    declaring those ops)."""
    value = ev.host.current(value)
    if isinstance(value, SymText) or (isinstance(value, SymParsed) and is_sym_text(ev, value)):
        return ev.host.as_ref(value)
    if type(value) is dict:
        return {k: export(ev, v) for k, v in value.items()}
    if type(value) is list:
        return [export(ev, v) for v in value]
    if type(value) is tuple:
        return tuple(export(ev, v) for v in value)
    return value


def template_method(
    ev: Evaluator, template: Any, name: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """A prompt template's ``format`` / ``format_prompt`` / ``format_messages`` over
    symbolic values: its pieces (the tracing hook's own functions), or Python's."""
    from eclectus.adapters.pyeval.calls import _UNKNOWN

    if args or name not in ("format", "format_prompt", "format_messages"):
        return _UNKNOWN
    values = export(ev, kwargs)
    try:
        if isinstance(template, PromptTemplate):
            pieces = string_prompt_pieces(template, values, ev.host.repr_list)
            if name == "format":
                return make_text([p.text if isinstance(p, Value) else p for p in pieces])
            if name == "format_prompt":
                return SymPrompt(text=pieces)
            return _UNKNOWN
        if name == "format":
            return _UNKNOWN
        messages = chat_prompt_messages(template, values, ev.host.repr_list)
    except (NotLowerable, KeyError):
        return _UNKNOWN
    if name == "format_prompt":
        return SymPrompt(messages=messages)
    out: list[BaseMessage | SymChat] = []
    for cls, _, pieces in messages:
        if cls not in (HumanMessage, SystemMessage, AIMessage):
            return _UNKNOWN
        text = make_text([p.text if isinstance(p, Value) else p for p in pieces])
        out.append(cls(content=text) if isinstance(text, str) else SymChat(cls, _parts(text)))
    return out


def _parts(text: Ref | SymText) -> tuple[Any, ...]:
    return (text,) if isinstance(text, Ref) else text.parts


def _model_of(runnable: Runnable) -> Any | None:
    """The Eclectus model when ``runnable`` is one, or one bound with call kwargs."""
    if isinstance(runnable, MODEL_TYPES):
        return runnable
    if isinstance(runnable, RunnableBinding) and isinstance(runnable.bound, MODEL_TYPES):
        return runnable.bound
    return None


def _starts_with_model(runnable: Runnable) -> bool:
    """A sequence whose first step is a model (``with_structured_output``'s)."""
    return isinstance(runnable, RunnableSequence) and _model_of(runnable.first) is not None


def _python(
    ev: Evaluator, runnable: Runnable, method: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """The eager call, its arguments fetched (a graph break when any is symbolic)."""
    args = ev.concrete(list(args), f"{type(runnable).__name__}.{method} as Python")
    kwargs = ev.concrete(dict(kwargs), f"{type(runnable).__name__}.{method} as Python")
    return getattr(runnable, method)(*args, **kwargs)
