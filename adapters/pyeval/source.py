"""A function's own syntax tree, found from its code object, and what it supports.

:func:`function_source` parses the file a function was defined in (cached per file text)
and finds the ``def`` or ``lambda`` whose code object the function runs, checked by name,
line and parameters, so the tree evaluated is the code Python would run. Then the
pre-pass (:func:`unsupported`) reads the whole body *before anything runs*: a construct the
evaluator does not implement (a class body, ``try``, ``with``, a generator, ``global``...)
makes the whole function run as plain Python, so no statement ever runs twice.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda

# Calls that read or write the calling frame itself: evaluated, the frame would be ours.
_FRAME_BUILTINS = frozenset({"locals", "vars", "eval", "exec", "dir", "breakpoint"})
_FRAME_ATTRS = frozenset({"_getframe", "currentframe", "stack", "f_back", "f_locals"})


@dataclass(eq=False)
class Source:
    """One function's tree and what the evaluator needs to know of it (immutable once
    built, but for ``compiled``: native expression code by node, filled lazily)."""

    node: FunctionNode
    filename: str
    reasons: list[str]  # why it must run as plain Python ("line 4: a try statement"); []
    compiled: dict[int, types.CodeType] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _static: dict[int, tuple[bool, frozenset[str]]] = field(default_factory=dict)

    def static(self, node: ast.AST) -> tuple[bool, frozenset[str]]:
        """Whether ``node`` holds a call or an await, and the names it reads (cached)."""
        found = self._static.get(id(node))
        if found is None:
            walked = list(ast.walk(node))
            has_call = any(isinstance(n, ast.Call | ast.Await) for n in walked)
            names = frozenset(n.id for n in walked if isinstance(n, ast.Name))
            found = self._static[id(node)] = (has_call, names)
        return found

    @property
    def is_async(self) -> bool:
        return isinstance(self.node, ast.AsyncFunctionDef)

    @property
    def body(self) -> list[ast.stmt]:
        """The statements (a lambda's body as one ``return``)."""
        if isinstance(self.node, ast.Lambda):
            ret = ast.Return(self.node.body)
            ast.copy_location(ret, self.node.body)
            return [ret]
        return self.node.body


_CACHE: dict[types.CodeType, Source | str] = {}
_TREES: dict[str, tuple[list[str], ast.Module | None]] = {}
_LOCK = threading.Lock()


def function_source(fn: types.FunctionType) -> Source | str:
    """The function's source, or a one-line reason why it has none the evaluator can use
    (no source file, a wrapper, a tree that is not this code). Cached per code object."""
    code = fn.__code__
    with _LOCK:
        hit = _CACHE.get(code)
    if hit is not None:
        return hit
    found = _find(fn)
    with _LOCK:
        _CACHE[code] = found
    return found


def _find(fn: types.FunctionType) -> Source | str:
    if getattr(fn, "__wrapped__", None) is not None:
        return "a wrapper function (functools.wraps): its source is another function's"
    code = fn.__code__
    filename = code.co_filename
    tree = _tree(filename, inspect.getmodule(fn))
    if tree is None:
        return f"no source for {fn.__qualname__} ({filename})"
    candidates = [n for n in _defs(tree) if _matches(n, code)]
    if len(candidates) > 1:
        candidates = [n for n in candidates if _contains_positions(n, code)]
    if len(candidates) != 1:
        return f"the source of {fn.__qualname__} is not unique on line {code.co_firstlineno}"
    node = candidates[0]
    return Source(node, filename, unsupported(node))


def _tree(filename: str, module: Any) -> ast.Module | None:
    lines = linecache.getlines(filename, module.__dict__ if module else None)
    if not lines:
        return None
    with _LOCK:
        cached = _TREES.get(filename)
        if cached is not None and cached[0] == lines:
            return cached[1]
    try:
        tree: ast.Module | None = ast.parse("".join(lines), filename)
    except SyntaxError:
        tree = None
    with _LOCK:
        _TREES[filename] = (list(lines), tree)
    return tree


def _defs(tree: ast.AST) -> Iterator[FunctionNode]:
    for node in ast.walk(tree):
        if isinstance(node, FunctionNode):
            yield node


def _matches(node: FunctionNode, code: types.CodeType) -> bool:
    """Whether ``node`` compiles to ``code``: its name, first line and parameters."""
    if isinstance(node, ast.Lambda):
        if code.co_name != "<lambda>" or node.lineno != code.co_firstlineno:
            return False
    else:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        if node.name != code.co_name or first != code.co_firstlineno:
            return False
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    num = code.co_argcount + code.co_kwonlyargcount
    num += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return names == list(code.co_varnames[:num])


def _contains_positions(node: FunctionNode, code: types.CodeType) -> bool:
    """Whether the code's instructions lie within ``node``'s span (lambdas on one line)."""
    spans = [(line, col) for line, _, col, _ in code.co_positions() if line and col is not None]
    body = node.body if isinstance(node, ast.Lambda) else node
    start = (body.lineno, body.col_offset)
    end = (body.end_lineno or body.lineno, body.end_col_offset or 0)
    return bool(spans) and all(start <= s <= end for s in spans[1:])


def unsupported(node: FunctionNode) -> list[str]:
    """Why the evaluator cannot run ``node``'s body, each reason with its line; [] when it
    can (pure). Decided from the code alone, before anything runs."""
    finder = _Unsupported()
    for stmt in node.body if not isinstance(node, ast.Lambda) else [node.body]:
        finder.visit(stmt)
    return finder.reasons


class _Unsupported(ast.NodeVisitor):
    """Collects the constructs the evaluator leaves to Python (nested scopes not entered:
    a lambda runs as Python's own function)."""

    _STATEMENTS: ClassVar[dict[type, str]] = {
        ast.FunctionDef: "a nested def",
        ast.AsyncFunctionDef: "a nested async def",
        ast.ClassDef: "a class body",
        ast.Try: "a try statement",
        ast.With: "a with statement",
        ast.AsyncWith: "an async with statement",
        ast.AsyncFor: "an async for loop",
        ast.Match: "a match statement",
        ast.Import: "an import",
        ast.ImportFrom: "an import",
        ast.Global: "a global statement",
        ast.Nonlocal: "a nonlocal statement",
        ast.Yield: "yield (a generator)",
        ast.YieldFrom: "yield from (a generator)",
        ast.NamedExpr: "an assignment expression (:=)",
    }

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self._comprehensions = 0  # nesting, for an await inside one (an async comprehension)

    def _add(self, node: ast.AST, what: str) -> None:
        self.reasons.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    def generic_visit(self, node: ast.AST) -> None:
        what = self._STATEMENTS.get(type(node))
        if what is not None:
            self._add(node, what)
            return
        if sys_try_star(node):
            self._add(node, "a try statement")
            return
        super().generic_visit(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return  # Python's own function, closing over the evaluator's cells: exact

    def visit_Raise(self, node: ast.Raise) -> None:
        if node.exc is None:
            self._add(node, "a bare raise (it re-raises the caller's exception)")
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        if node.is_async:
            self._add(node.iter, "an async comprehension")
        self.generic_visit(node)

    def _comprehension(self, node: ast.AST) -> None:
        self._comprehensions += 1
        self.generic_visit(node)
        self._comprehensions -= 1

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Await(self, node: ast.Await) -> None:
        if self._comprehensions:
            self._add(node, "an await inside a comprehension (an async comprehension)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _FRAME_BUILTINS:  # noqa: SIM102
            if func.id != "dir" or not node.args:  # dir(x) reads no frame
                self._add(node, f"{func.id}() reads the calling frame")
        if isinstance(func, ast.Name) and func.id == "super" and not node.args:
            self._add(node, "super() without arguments reads the calling frame")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _FRAME_ATTRS:
            self._add(node, f".{node.attr} reads the calling frame")
        self.generic_visit(node)


def sys_try_star(node: ast.AST) -> bool:
    """``try: ... except* ...`` (Python 3.11's TryStar)."""
    return type(node).__name__ == "TryStar"
