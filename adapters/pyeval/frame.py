"""One evaluated call's local variables, and Python's own evaluation of expressions in it.

Every local of the function (what its code object calls ``co_varnames`` and
``co_cellvars``: Python's own classification) lives in a cell. An expression that touches no
symbolic value is compiled, once per syntax node, as the body of a function closing over
those cells, the function's own closure cells and its module globals, and then called: so
its names resolve as they do in the function itself (a local, a free variable, a global, a
builtin, live), a lambda or comprehension inside it closes over the very same variables,
and its semantics are Python's because Python runs it.
"""

from __future__ import annotations

import ast
import copy
import types
from typing import Any

from eclectus.adapters.pyeval.source import Source

_SCOPE = "__eclectus_scope__"
_EXPR = "__eclectus_expr__"


class Frame:
    """The variables of one evaluated call (mutated by :meth:`store` and :meth:`delete`)."""

    def __init__(self, fn: types.FunctionType, source: Source) -> None:
        self.fn = fn
        self.source = source
        code = fn.__code__
        self.globals = fn.__globals__
        self.cells: dict[str, types.CellType] = {
            name: types.CellType() for name in (*code.co_varnames, *code.co_cellvars)
        }
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            self.cells.setdefault(name, cell)  # a free variable: the closure's own cell
        self.local_names = frozenset((*code.co_varnames, *code.co_cellvars))
        builtins = self.globals.get("__builtins__", __builtins__)
        self.builtins = builtins if isinstance(builtins, dict) else vars(builtins)

    def child(self, names: set[str]) -> Frame:
        """A frame for a comprehension's scope: fresh cells for ``names`` (its targets),
        the same cells for everything else (pure)."""
        child = Frame.__new__(Frame)
        child.fn, child.source, child.globals = self.fn, self.source, self.globals
        child.builtins, child.local_names = self.builtins, self.local_names - names
        child.cells = {**self.cells, **{name: types.CellType() for name in names}}
        return child

    # -- names ------------------------------------------------------------------------------

    def load(self, name: str) -> Any:
        """The value of ``name`` as the function's own code would read it (pure)."""
        cell = self.cells.get(name)
        if cell is not None:
            try:
                return cell.cell_contents
            except ValueError:
                raise self._unbound(name) from None
        if name in self.globals:
            return self.globals[name]
        if name in self.builtins:
            return self.builtins[name]
        raise NameError(f"name '{name}' is not defined", name=name)

    def store(self, name: str, value: Any) -> None:
        cell = self.cells.get(name)
        if cell is None:  # only locals are assigned: the pre-pass refuses global/nonlocal
            raise RuntimeError(f"assignment to {name!r}, which is not a local")
        cell.cell_contents = value

    def delete(self, name: str) -> None:
        cell = self.cells[name]
        try:
            del cell.cell_contents
        except ValueError:
            raise self._unbound(name) from None

    def _unbound(self, name: str) -> NameError:
        if name in self.local_names:
            message = (
                f"cannot access local variable '{name}' where it is not associated with a value"
            )
            return UnboundLocalError(message)
        message = (
            f"cannot access free variable '{name}' where it is not associated with a value "
            "in enclosing scope"
        )
        return NameError(message, name=name)

    # -- Python's own evaluation -------------------------------------------------------------

    def native(self, node: ast.expr) -> Any:
        """``node`` evaluated by Python in this frame (its exceptions are Python's)."""
        code = self._code(node)
        closure = tuple(self.cells[name] for name in code.co_freevars)
        function = types.FunctionType(code, self.globals, _EXPR, None, closure)
        try:
            return function()
        except NameError as exc:
            name = getattr(exc, "name", None)
            if name in self.local_names and exc.__traceback__ is not None:
                frames = [tb.tb_frame.f_code for tb in _walk(exc.__traceback__)]
                if frames[-1] is code and _empty(self.cells[name]):
                    raise self._unbound(name) from None
            raise

    def _code(self, node: ast.expr) -> types.CodeType:
        source = self.source
        key = id(node)
        code = source.compiled.get(key)
        if code is not None:
            return code
        names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & set(self.cells))
        code = compile_expression(node, names, source.filename)
        with source.lock:
            source.compiled[key] = code
        return code


def compile_expression(node: ast.expr, names: list[str], filename: str) -> types.CodeType:
    """The code of a function ``() -> node`` whose free variables are ``names`` (pure):
    compiled inside a scope that binds them, so Python makes them cells of the closure."""
    body = copy.deepcopy(node)
    inner = ast.FunctionDef(
        name=_EXPR,
        args=_no_args(),
        body=[ast.Return(body)],
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    scope_body: list[ast.stmt] = []
    if names:
        targets = [ast.Name(n, ast.Store()) for n in names]
        scope_body.append(ast.Assign(targets=targets, value=ast.Constant(None)))
    scope_body += [inner, ast.Return(ast.Name(_EXPR, ast.Load()))]
    scope = ast.FunctionDef(
        name=_SCOPE,
        args=_no_args(),
        body=scope_body,
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    module = ast.Module(body=[scope], type_ignores=[])
    for wrapper in (scope, inner, *scope_body, inner.body[0]):
        ast.copy_location(wrapper, node)
    ast.fix_missing_locations(module)
    module_code = compile(module, filename, "exec")
    scope_code = next(c for c in module_code.co_consts if isinstance(c, types.CodeType))
    return next(c for c in scope_code.co_consts if isinstance(c, types.CodeType))


def _no_args() -> ast.arguments:
    return ast.arguments(
        posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
        defaults=[],
    )  # fmt: skip


def _walk(tb: types.TracebackType) -> list[types.TracebackType]:
    out = []
    while tb is not None:
        out.append(tb)
        tb = tb.tb_next  # type: ignore[assignment]
    return out


def _empty(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return True
    return False
