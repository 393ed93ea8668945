"""Which Eclectus model an app function's graph runs on: the first one it refers to.

``compile(fn)`` and the LangGraph compiler need a model (its server, its options) before
anything runs. A function names its model as a global, a closure variable or a default
(``llm``, ``chain = prompt | llm``), or through a helper of the app it calls; this finds
the first Eclectus model so referred to, without running anything.
"""

from __future__ import annotations

import types
from typing import Any

from langchain_core.runnables import Runnable

from eclectus.adapters.langchain.compiler.compile import find_model

MAX_HELPERS = 3  # how deep helpers are searched


def model_in_function(fn: Any, depth: int = 0) -> Any | None:
    """The first Eclectus model ``fn`` refers to, directly or through its app's helpers
    (pure: reads names, runs nothing); None when there is none."""
    from eclectus.adapters.pyeval.calls import is_app_code

    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return None
    for value in _referenced(fn):
        if isinstance(value, Runnable):
            found = find_model(value)
            if found is not None:
                return found
        elif isinstance(value, types.FunctionType) and depth < MAX_HELPERS and is_app_code(value):
            found = model_in_function(value, depth + 1)
            if found is not None:
                return found
    return None


def _referenced(fn: types.FunctionType) -> list[Any]:
    """The values of the globals, closure variables and defaults ``fn``'s code names."""
    values: list[Any] = list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    for _name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        try:
            values.append(cell.cell_contents)
        except ValueError:
            continue
    for name in _names(fn.__code__):
        if name in fn.__globals__:
            values.append(fn.__globals__[name])
    return values


def _names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _names(const)
    return names
