"""Calls: model calls become server calls, app helpers are evaluated, the rest is Python.

The evaluator has evaluated the callee and the arguments (in Python's order) when it asks
:func:`call`. In order:

1. ``invoke`` / ``ainvoke`` / ``batch`` / ``abatch`` of an Eclectus model, of an LCEL chain
   holding one, or of a prompt template: lowered by the chain compiler (models.py);
2. a known function over symbolic values, with Python's exact result: ``str``, ``repr``,
   ``len``, ``isinstance``, ``sep.join``, ``template.format``, a prompt template's
   ``format``, a string method with constant arguments (methods.py), ``Send``,
   ``Command``, a message class, ``list.append`` and the other methods that only place
   values, ``asyncio.gather`` of symbolic awaitables;
3. a function of the app itself: evaluated the same way (depth-limited);
4. anything else: Python's call, its symbolic arguments fetched first (a graph break).
"""

from __future__ import annotations

import asyncio
import sysconfig
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.runnables import Runnable
from langgraph.types import Command, Send

from eclectus.adapters.langchain.compiler.symbols import SymParsed
from eclectus.adapters.langchain.pieces import Spread, Symbolic
from eclectus.adapters.pyeval import fields, models
from eclectus.adapters.pyeval.formats import str_format
from eclectus.adapters.pyeval.operators import (
    attribute,
    is_sym_text,
    join_text,
    repr_of,
    str_of,
    text_of,
)
from eclectus.adapters.pyeval.values import Deferred, SymChat, is_symbolic, text_parts

if TYPE_CHECKING:
    from eclectus.adapters.pyeval.interp import Evaluator

MESSAGE_CLASSES = (HumanMessage, SystemMessage, AIMessage)
# list and dict methods that place or pick values without reading them
_PLACING = {
    list: frozenset({"append", "insert", "copy", "pop", "clear", "extend"}),
    dict: frozenset(
        {"get", "setdefault", "update", "pop", "copy", "keys", "values", "items", "clear"}
    ),
}
_LOOP_CALLS = (
    asyncio.create_task,
    asyncio.ensure_future,
    asyncio.get_running_loop,
    asyncio.get_event_loop,
)
_STORING = frozenset({"append", "insert", "extend", "setdefault", "update"})
_ITERATING = (list, tuple, enumerate, zip, reversed, iter)
_LIBRARY_ROOTS = tuple(
    str(Path(p).resolve())
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
)
_OWN_PACKAGES = ("eclectus.adapters", "eclectus.server", "eclectus.protocol", "eclectus.evals")


def call(ev: Evaluator, func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` (see the module)."""
    host = ev.host
    args = [host.current(a) for a in args]
    kwargs = {k: host.current(v) for k, v in kwargs.items()}
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", "")
    if isinstance(owner, Runnable) and name in models.RUN_METHODS and models.lowerable(owner):
        return models.run_method(ev, owner, name, args, kwargs)
    if _among(func, _LOOP_CALLS):  # they need the running loop, which the worker thread has not
        args = ev.concrete(args, f"calling {_name(func)} with a server value")
        return ev.host.on_loop(func, *args, **ev.concrete(kwargs, "asyncio's arguments"))
    symbolic = is_symbolic(args) or is_symbolic(kwargs)
    if symbolic:
        found = _known(ev, func, owner, name, args, kwargs)
        if found is not _UNKNOWN:
            return found
    elif func is asyncio.gather:
        return _gather(ev, args, kwargs)
    app = _app_function(func)
    if app is not None:
        return ev.evaluate_helper(app[0], app[1], args, kwargs)
    if symbolic:
        args = ev.concrete(args, f"calling {_name(func)} with a server value")
        kwargs = ev.concrete(kwargs, f"calling {_name(func)} with a server value")
    return func(*args, **kwargs)


_UNKNOWN = object()


def _known(
    ev: Evaluator, func: Any, owner: Any, name: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """The result of a known function over symbolic arguments, or _UNKNOWN."""
    if func is str and len(args) == 1 and not kwargs:
        return str_of(ev, args[0])
    if func is repr and len(args) == 1 and not kwargs:
        return repr_of(ev, args[0])
    if func is len and len(args) == 1 and not kwargs:
        return _len(ev, args[0])
    if func is isinstance and len(args) == 2 and not kwargs and not is_symbolic(args[1]):
        known = _known_type(ev, args[0])
        return issubclass(known, args[1]) if known is not None else _UNKNOWN
    if func is getattr and len(args) == 2 and not kwargs and type(args[1]) is str:
        return attribute(ev, args[0], args[1])
    if func is asyncio.gather:
        return _gather(ev, args, kwargs)
    plain_kwargs = not kwargs or (func is zip and set(kwargs) == {"strict"})
    if _among(func, _ITERATING) and plain_kwargs and all(_iterable(ev, a) for a in args):
        made = func(*args, **kwargs)
        return ev.host.own(made) if type(made) is list else made
    plain_dict = func is dict and (not args or (len(args) == 1 and type(args[0]) is dict))
    if plain_dict and not any(is_symbolic(k) for k in (args[0] if args else {})):
        return ev.host.own(func(*args, **kwargs))
    if isinstance(owner, str) and type(owner) is str and name == "join" and len(args) == 1:
        return join_text(ev, owner, args[0])
    if isinstance(owner, str) and type(owner) is str and name == "format":
        found = str_format(ev, owner, args, kwargs)
        return found if found is not None else _UNKNOWN
    if type(owner) in _PLACING and name in _PLACING[type(owner)]:
        return _placing(ev, func, owner, name, args, kwargs)
    if isinstance(owner, PromptTemplate | ChatPromptTemplate):
        return models.template_method(ev, owner, name, args, kwargs)
    if func is Send and len(args) == 2 and not kwargs and not is_symbolic(args[0]):
        return Send(args[0], args[1])
    if func is Command and not args:
        goto = kwargs.get("goto")
        if is_symbolic(goto):
            kwargs["goto"] = ev.concrete(goto, "a Command's goto names a node")
        return Command(**kwargs)
    if _among(func, MESSAGE_CLASSES):
        return _message(ev, func, args, kwargs)
    return _UNKNOWN


def _len(ev: Evaluator, value: Any) -> Any:
    if type(value) in (list, tuple, dict) and not _spread(value):
        return len(value)
    if isinstance(value, SymParsed):
        found = fields.shape(value)
        if found is not None and found.kind == "list" and found.max_items == found.min_items:
            return found.min_items  # the schema fixes the length
    return len(ev.concrete(value, "len() of a server value"))


def _known_type(ev: Evaluator, value: Any) -> type | None:
    if is_sym_text(ev, value):
        return str
    if isinstance(value, SymParsed):
        return fields.python_type(value)
    if type(value) in (list, tuple, dict):
        return type(value)
    return None


def _iterable(ev: Evaluator, value: Any) -> bool:
    """Iterating ``value`` yields its items without reading them, its length known."""
    return type(value) in (list, tuple, dict) and not _spread(value)


def _spread(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    return any(isinstance(i, Spread) for i in items)


def _placing(
    ev: Evaluator, func: Any, owner: Any, name: str, args: list[Any], kwargs: dict[str, Any]
) -> Any:
    """A list or dict method that only stores or picks values: its keys and indices
    concrete, an iterable argument of known length, and the container one the evaluation
    made or the run's state (else the app may read what it holds later: values go in
    concrete)."""
    if not ev.host.may_hold(owner) and name in _STORING:
        return _UNKNOWN
    keys: list[Any] = []
    if name in ("get", "setdefault", "pop", "insert") and args:
        keys = [args[0]]
    if name == "update" and args:
        if type(args[0]) is not dict:
            return _UNKNOWN
        keys = list(args[0])
    if name == "extend" and not (args and _iterable(ev, args[0])):
        return _UNKNOWN
    if any(isinstance(k, Symbolic) for k in keys):
        return _UNKNOWN
    result = func(*args, **kwargs)
    return ev.host.own(result) if name == "copy" else result


def _message(ev: Evaluator, cls: type, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``HumanMessage(content=text)`` (or positional) with symbolic text: a SymChat."""
    content = args[0] if len(args) == 1 and not kwargs else kwargs.get("content")
    if (len(args) == 1 and kwargs) or (not args and set(kwargs) != {"content"}):
        return _UNKNOWN
    parts = text_of(ev, content)
    if parts is None:
        return _UNKNOWN
    return SymChat(cls, text_parts(parts))


def _gather(ev: Evaluator, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``asyncio.gather`` of the evaluator's own awaitables: a Deferred of their results
    in order (each evaluated in argument order); of anything else, Python's."""
    if args and all(isinstance(a, Deferred) for a in args) and not kwargs.get("return_exceptions"):
        return Deferred(lambda: [a.value() for a in args], lambda: _real_gather(ev, args))
    args = ev.concrete(args, "asyncio.gather of awaitables the evaluator does not hold")
    return asyncio.gather(*args, **kwargs)


def _real_gather(ev: Evaluator, args: list[Any]) -> Any:
    return asyncio.gather(*ev.concrete(list(args), "asyncio.gather run as Python"))


def _app_function(func: Any) -> tuple[types.FunctionType, list[Any]] | None:
    """``(function, bound arguments)`` when ``func`` is a plain function or method of the
    app (not of the standard library, an installed package or Eclectus's own layers)."""
    bound: list[Any] = []
    if isinstance(func, types.MethodType):
        bound, func = [func.__self__], func.__func__
    if not isinstance(func, types.FunctionType) or not is_app_code(func):
        return None
    return func, bound


def is_app_code(func: types.FunctionType) -> bool:
    """Whether ``func`` is the app's own code (pure)."""
    module = getattr(func, "__module__", "") or ""
    if module.startswith(_OWN_PACKAGES) or module.startswith(("langchain", "langgraph")):
        return False
    filename = func.__code__.co_filename
    if filename.startswith("<"):
        return False
    resolved = str(Path(filename).resolve())
    return not resolved.startswith(_LIBRARY_ROOTS)


def _among(func: Any, known: tuple[Any, ...]) -> bool:
    """``func`` is one of ``known`` (by identity: an app's object may define ``==``)."""
    return any(func is k for k in known)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or type(func).__name__
