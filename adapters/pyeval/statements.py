"""Statements, run with Python's semantics over concrete and symbolic values.

Assignment and unpacking (the unpacking itself done by Python), augmented assignment,
``if``/``for``/``while`` with ``break``/``continue``/``else``, ``return``, ``raise``,
``assert``, ``del``. A decision on a symbolic value (a branch, a loop over a list of
unknown length) fetches it first: a graph break. A symbolic value is stored only into a
list or dict the evaluation made or the run's state (host.may_hold): the app's own
containers get it concrete.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from eclectus.adapters.langchain.pieces import Spread, Symbolic
from eclectus.adapters.pyeval import operators
from eclectus.adapters.pyeval.values import is_symbolic

if TYPE_CHECKING:
    from eclectus.adapters.pyeval.frame import Frame
    from eclectus.adapters.pyeval.host import Host

BREAK, CONTINUE, RETURN = object(), object(), object()


class Statements:
    """The statement half of the evaluator (interp.Evaluator)."""

    frame: Frame
    host: Host
    line: int
    returned: Any

    def eval(self, node: ast.expr) -> Any:
        raise NotImplementedError  # expressions.Expressions

    def concrete(self, value: Any, reason: str) -> Any:
        raise NotImplementedError  # interp.Evaluator

    def block(self, body: list[ast.stmt]) -> object | None:
        for stmt in body:
            self.line = stmt.lineno
            signal = getattr(self, "_" + type(stmt).__name__)(stmt)
            if signal is not None:
                return signal
        return None

    def _Expr(self, node: ast.Expr) -> None:
        self.eval(node.value)

    def _Pass(self, node: ast.Pass) -> None:
        return None

    def _Break(self, node: ast.Break) -> object:
        return BREAK

    def _Continue(self, node: ast.Continue) -> object:
        return CONTINUE

    def _Return(self, node: ast.Return) -> object:
        self.returned = self.eval(node.value) if node.value is not None else None
        return RETURN

    def _Assign(self, node: ast.Assign) -> None:
        value = self.eval(node.value)
        for target in node.targets:
            self.assign(target, value)

    def _AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.assign(node.target, self.eval(node.value))
        elif isinstance(node.target, ast.Attribute):
            self.eval(node.target.value)
        elif isinstance(node.target, ast.Subscript):
            self.eval(node.target.value)
            self.eval(node.target.slice)

    def _AugAssign(self, node: ast.AugAssign) -> None:
        target, op = node.target, type(node.op)
        if isinstance(target, ast.Name):
            current = self.host.current(self.frame.load(target.id))
            self.frame.store(target.id, operators.inplace(self, op, current, self.eval(node.value)))
        elif isinstance(target, ast.Attribute):
            owner = self._concrete_owner(self.eval(target.value))
            current = operators.attribute(self, owner, target.attr)
            value = operators.inplace(self, op, current, self.eval(node.value))
            setattr(owner, target.attr, self._placed(owner, value))
        else:
            assert isinstance(target, ast.Subscript)
            owner = self._concrete_owner(self.eval(target.value))
            key = self._concrete_key(self.eval(target.slice))
            current = operators.subscript(self, owner, key)
            value = operators.inplace(self, op, current, self.eval(node.value))
            owner[key] = self._placed(owner, value)

    def _If(self, node: ast.If) -> object | None:
        branch = node.body if operators.truth(self, self.eval(node.test)) else node.orelse
        return self.block(branch)

    def _While(self, node: ast.While) -> object | None:
        while operators.truth(self, self.eval(node.test)):
            signal = self.block(node.body)
            if signal is BREAK:
                return None
            if signal is RETURN:
                return signal
        return self.block(node.orelse)

    def _For(self, node: ast.For) -> object | None:
        for item in self._iterate(self.eval(node.iter), "a loop over"):
            self.assign(node.target, item)
            signal = self.block(node.body)
            if signal is BREAK:
                return None
            if signal is RETURN:
                return signal
            self.line = node.lineno
        return self.block(node.orelse)

    def _Raise(self, node: ast.Raise) -> None:
        assert node.exc is not None  # the pre-pass refuses a bare raise
        exc = self.concrete(self.eval(node.exc), "raising a server value")
        if node.cause is None:
            raise exc
        raise exc from self.concrete(self.eval(node.cause), "raising a server value")

    def _Assert(self, node: ast.Assert) -> None:
        if sys.flags.optimize:
            return  # python -O strips asserts
        if not operators.truth(self, self.eval(node.test)):
            if node.msg is None:
                raise AssertionError
            raise AssertionError(self.concrete(self.eval(node.msg), "an assert's message"))

    def _Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.frame.delete(target.id)
            elif isinstance(target, ast.Attribute):
                delattr(self._concrete_owner(self.eval(target.value)), target.attr)
            elif isinstance(target, ast.Subscript):
                owner = self._concrete_owner(self.eval(target.value))
                del owner[self._concrete_key(self.eval(target.slice))]
            else:
                for element in target.elts:  # type: ignore[attr-defined]
                    self._Delete(ast.Delete(targets=[element]))

    # -- assignment ---------------------------------------------------------------------

    def assign(self, target: ast.expr, value: Any) -> None:
        """``target = value`` (mutates the frame or the target's container)."""
        if isinstance(target, ast.Name):
            self.frame.store(target.id, value)
        elif isinstance(target, ast.Attribute):
            owner = self._concrete_owner(self.eval(target.value))
            setattr(owner, target.attr, self._placed(owner, value))
        elif isinstance(target, ast.Subscript):
            owner = self._concrete_owner(self.eval(target.value))
            key = self._concrete_key(self.eval(target.slice))
            owner[key] = self._placed(owner, value)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value)
        else:
            assert isinstance(target, ast.Tuple | ast.List)
            items = _unpacker(target.elts)(self._sequence(value, "unpacking"))
            for element, item in zip(target.elts, items, strict=True):
                self.assign(element, item)

    def _placed(self, owner: Any, value: Any) -> Any:
        """What may be stored into ``owner``: anything into a list or dict the evaluation
        made or the run's state (they only hold it), concrete values into anything else
        (the app may read it later, and an object's setter may read it now)."""
        if self.host.may_hold(owner):
            return value
        return self.concrete(value, f"storing a server value into a {type(owner).__name__}")

    def _concrete_owner(self, owner: Any) -> Any:
        owner = self.host.current(owner)
        if isinstance(owner, Symbolic) or (type(owner) is list and _has_spread(owner)):
            return self.concrete(owner, "changing a server value in place")
        return owner

    def _concrete_key(self, key: Any) -> Any:
        return self.concrete(key, "a server value as a key") if is_symbolic(key) else key

    def _sequence(self, value: Any, what: str) -> Any:
        value = self.host.current(value)
        if isinstance(value, Symbolic) or (type(value) is list and _has_spread(value)):
            return self.concrete(value, f"{what} a server value of unknown length")
        return value

    def _iterate(self, value: Any, what: str) -> Iterator[Any]:
        value = self._sequence(value, what)
        if type(value) not in (list, tuple, dict) and is_symbolic(value):
            value = self.concrete(value, f"{what} a server value")
        return iter(value)


def _has_spread(items: list[Any]) -> bool:
    return any(isinstance(i, Spread) for i in items)


_UNPACKERS: dict[tuple[int, int | None], Callable[[Any], tuple[Any, ...]]] = {}


def _unpacker(targets: list[ast.expr]) -> Callable[[Any], tuple[Any, ...]]:
    """Python's own unpacking into ``len(targets)`` names (one starred), as a function."""
    star = next((i for i, t in enumerate(targets) if isinstance(t, ast.Starred)), None)
    key = (len(targets), star)
    found = _UNPACKERS.get(key)
    if found is None:
        names = [f"t{i}" if i != star else f"*t{i}" for i in range(len(targets))]
        plain = ", ".join(f"t{i}" for i in range(len(targets)))
        source = f"def unpack(value):\n    {', '.join(names)}, = value\n    return ({plain},)\n"
        namespace: dict[str, Any] = {}
        exec(compile(source, "<eclectus unpacking>", "exec"), namespace)
        found = _UNPACKERS[key] = namespace["unpack"]
    return found
