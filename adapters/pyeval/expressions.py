"""Expressions: Python's own where no symbolic value is involved, else node by node.

An expression that touches no symbolic value and holds no call is run by Python itself
(frame.py). Any other expression is walked node by node in Python's evaluation order: its
sub-expressions evaluated (natively where they can be), then its operator applied through
the closed table (operators.py) or its call dispatched (calls.py). Comprehensions get a
scope of their own, as in Python 3; a generator expression stays lazy unless a consumer
known to take it whole at once (``sep.join``, ``list``) gets it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from eclectus.adapters.langchain.pieces import Symbolic
from eclectus.adapters.pyeval import calls, operators
from eclectus.adapters.pyeval.statements import Statements
from eclectus.adapters.pyeval.values import is_symbolic, make_text

if TYPE_CHECKING:
    from eclectus.adapters.pyeval.source import Source


class Expressions(Statements):
    """The expression half of the evaluator (interp.Evaluator)."""

    source: Source

    def _scope(self, generators: list[ast.comprehension]) -> Expressions:
        raise NotImplementedError  # interp.Evaluator

    def eval(self, node: ast.expr) -> Any:
        """The value of ``node`` in this frame."""
        if self._is_native(node):
            return self.host.current(self.frame.native(node))
        method: Callable[[Any], Any] = getattr(self, "_e_" + type(node).__name__)
        return self.host.current(method(node))

    def _is_native(self, node: ast.expr) -> bool:
        """Python evaluates ``node`` itself: no call or await in it, and no name in it
        holds a symbolic value (pure)."""
        has_call, names = self.source.static(node)
        if has_call:
            return False
        for name in names:
            try:
                value = self.frame.load(name)
            except NameError:
                continue  # Python raises it, natively
            current = self.host.current(value)
            if current is not value:  # fetched since: Python must read the concrete twin
                self.frame.cells[name].cell_contents = current
            if is_symbolic(current):
                return False
        return True

    def _e_Name(self, node: ast.Name) -> Any:
        return self.frame.load(node.id)

    def _e_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def _e_Attribute(self, node: ast.Attribute) -> Any:
        return operators.attribute(self, self.eval(node.value), node.attr)

    def _e_Subscript(self, node: ast.Subscript) -> Any:
        value = self.eval(node.value)
        return operators.subscript(self, value, self.eval(node.slice))

    def _e_Slice(self, node: ast.Slice) -> Any:
        parts = [
            self.eval(p) if p is not None else None for p in (node.lower, node.upper, node.step)
        ]
        return slice(*self.concrete(parts, "a slice bound from a server value"))

    def _e_BinOp(self, node: ast.BinOp) -> Any:
        left = self.eval(node.left)
        return operators.binary(self, type(node.op), left, self.eval(node.right))

    def _e_UnaryOp(self, node: ast.UnaryOp) -> Any:
        return operators.unary(self, type(node.op), self.eval(node.operand))

    def _e_BoolOp(self, node: ast.BoolOp) -> Any:
        is_and = isinstance(node.op, ast.And)
        for value_node in node.values[:-1]:
            value = self.eval(value_node)
            if operators.truth(self, value) != is_and:
                return self.host.current(value)
        return self.eval(node.values[-1])

    def _e_Compare(self, node: ast.Compare) -> Any:
        left = self.eval(node.left)
        result: Any = True
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.eval(comparator)
            result = operators.compare(self, type(op), left, right)
            if comparator is not node.comparators[-1] and not operators.truth(self, result):
                return result
            left = right
        return result

    def _e_IfExp(self, node: ast.IfExp) -> Any:
        test = operators.truth(self, self.eval(node.test))
        return self.eval(node.body if test else node.orelse)

    def _e_JoinedStr(self, node: ast.JoinedStr) -> Any:
        parts: list[Any] = []
        for value in node.values:
            text = self.eval(value) if isinstance(value, ast.FormattedValue) else value.value  # type: ignore[attr-defined]
            parts += operators.text_of(self, text) or [text]
        return make_text(parts)

    def _e_FormattedValue(self, node: ast.FormattedValue) -> Any:
        value = self.eval(node.value)
        spec = self.eval(node.format_spec) if node.format_spec is not None else ""
        if is_symbolic(spec):
            spec = self.concrete(spec, "a format spec from a server value")
        return operators.formatted(self, value, node.conversion, spec)

    def _e_List(self, node: ast.List) -> list[Any]:
        return self.host.own(self._elements(node.elts))

    def _e_Tuple(self, node: ast.Tuple) -> tuple[Any, ...]:
        return tuple(self._elements(node.elts))

    def _e_Set(self, node: ast.Set) -> set[Any]:
        return set(self.concrete(self._elements(node.elts), "a set of server values"))

    def _e_Dict(self, node: ast.Dict) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if key_node is None:  # {**mapping}
                mapping = self.host.current(self.eval(value_node))
                if isinstance(mapping, Symbolic):
                    mapping = self.concrete(mapping, "unpacking a server value")
                out.update(mapping)
                continue
            key = self._concrete_key(self.eval(key_node))
            out[key] = self.eval(value_node)
        return self.host.own(out)

    def _elements(self, nodes: list[ast.expr]) -> list[Any]:
        out: list[Any] = []
        for element in nodes:
            if isinstance(element, ast.Starred):
                out.extend(self._iterate(self.eval(element.value), "unpacking"))
            else:
                out.append(self.eval(element))
        return out

    def _e_Lambda(self, node: ast.Lambda) -> Any:
        for name in self.source.static(node)[1]:  # Python's function reads these: concrete
            try:
                value = self.frame.load(name)
            except NameError:
                continue
            if is_symbolic(self.host.current(value)) and name in self.frame.cells:
                self.frame.cells[name].cell_contents = self.concrete(value, "a lambda over it")
        return self.frame.native(node)

    def _e_Await(self, node: ast.Await) -> Any:
        return self.host.await_(self.eval(node.value))

    def _e_Call(self, node: ast.Call) -> Any:
        func_node = node.func
        if isinstance(func_node, ast.Attribute):
            owner = self.eval(func_node.value)
            if isinstance(self.host.current(owner), Symbolic):
                from eclectus.adapters.pyeval.methods import symbolic_method

                return symbolic_method(self, owner, func_node.attr, node)
            func = getattr(owner, func_node.attr)
        else:
            func = self.eval(func_node)
        args, kwargs = self.arguments(node)
        return calls.call(self, func, args, kwargs)

    def arguments(self, node: ast.Call) -> tuple[list[Any], dict[str, Any]]:
        """A call's positional and keyword arguments, evaluated in Python's order; a
        generator expression given alone is kept lazy (:meth:`_e_GeneratorExp`)."""
        args: list[Any] = []
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                args.extend(self._iterate(self.eval(arg.value), "unpacking"))
            elif isinstance(arg, ast.GeneratorExp) and len(node.args) == 1 and not node.keywords:
                args.append(self._generator(arg, eager=_consumes(node)))
            else:
                args.append(self.eval(arg))
        kwargs: dict[str, Any] = {}
        for keyword in node.keywords:
            value = self.eval(keyword.value)
            if keyword.arg is not None:
                kwargs[keyword.arg] = value
                continue
            mapping = (
                self.concrete(value, "unpacking a server value")
                if isinstance(self.host.current(value), Symbolic)
                else value
            )
            for key in mapping:
                if key in kwargs:
                    raise TypeError(f"got multiple values for keyword argument '{key}'")
                kwargs[key] = mapping[key]
        return args, kwargs

    # -- comprehensions -----------------------------------------------------------------

    def _e_ListComp(self, node: ast.ListComp) -> list[Any]:
        out: list[Any] = self.host.own([])
        self._comprehend(node.generators, lambda ev: out.append(ev.eval(node.elt)))
        return out

    def _e_SetComp(self, node: ast.SetComp) -> set[Any]:
        out: list[Any] = []
        self._comprehend(node.generators, lambda ev: out.append(ev.eval(node.elt)))
        return set(self.concrete(out, "a set of server values"))

    def _e_DictComp(self, node: ast.DictComp) -> dict[Any, Any]:
        out: dict[Any, Any] = self.host.own({})

        def add(ev: Expressions) -> None:
            key = ev._concrete_key(ev.eval(node.key))
            out[key] = ev.eval(node.value)

        self._comprehend(node.generators, add)
        return out

    def _e_GeneratorExp(self, node: ast.GeneratorExp) -> Any:
        return self._generator(node, eager=False)

    def _generator(self, node: ast.GeneratorExp, eager: bool) -> Any:
        """A generator expression: a list of its items when a known consumer takes it
        whole at once (``join``, ``list``...), else a lazy generator yielding concrete
        items (Python code consumes it)."""
        if eager:
            return self._e_ListComp(ast.ListComp(elt=node.elt, generators=node.generators))
        if self._is_native(node):
            return self.frame.native(node)
        first = self._iterate(self.eval(node.generators[0].iter), "iterating")
        scope = self._scope(node.generators)

        def items() -> Iterator[Any]:
            yield from scope._produce(node.generators, 0, first, node.elt)

        return items()

    def _produce(
        self, generators: list[ast.comprehension], index: int, it: Iterator[Any], elt: ast.expr
    ) -> Iterator[Any]:
        gen = generators[index]
        for item in it:
            self.assign(gen.target, item)
            if all(operators.truth(self, self.eval(cond)) for cond in gen.ifs):
                if index + 1 == len(generators):
                    yield self.concrete(self.eval(elt), "a generator's item read by Python")
                else:
                    inner = self._iterate(self.eval(generators[index + 1].iter), "iterating")
                    yield from self._produce(generators, index + 1, inner, elt)

    def _comprehend(
        self, generators: list[ast.comprehension], emit: Callable[[Expressions], None]
    ) -> None:
        first = self._iterate(self.eval(generators[0].iter), "iterating")
        self._scope(generators)._loop(generators, 0, first, emit)

    def _loop(
        self,
        generators: list[ast.comprehension],
        index: int,
        it: Iterator[Any],
        emit: Callable[[Expressions], None],
    ) -> None:
        gen = generators[index]
        for item in it:
            self.assign(gen.target, item)
            if not all(operators.truth(self, self.eval(cond)) for cond in gen.ifs):
                continue
            if index + 1 == len(generators):
                emit(self)
            else:
                inner = self._iterate(self.eval(generators[index + 1].iter), "iterating")
                self._loop(generators, index + 1, inner, emit)


def _consumes(node: ast.Call) -> bool:
    """A call that takes a generator argument whole, right away: ``sep.join(...)``,
    ``list(...)``, ``tuple(...)`` (decided from its syntax; checked again at the call)."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "join":
        return isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)
    return isinstance(func, ast.Name) and func.id in ("list", "tuple")
