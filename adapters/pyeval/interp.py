"""The evaluator: a function's statements run one by one over concrete and symbolic values.

An expression that touches no symbolic value and holds no call is run by Python itself
(frame.py). Any other expression is walked node by node in Python's evaluation order: its
sub-expressions evaluated (natively where they can be), then its operator applied through
the closed table (operators.py) or its call dispatched (calls.py). Statements are
interpreted with Python's semantics: assignment and unpacking (the unpacking itself done
by Python), augmented assignment, ``if``/``for``/``while`` with ``break``/``continue``/
``else``, ``return``, ``raise``, ``assert``, ``del``. A decision on a symbolic value (a
branch, a loop over a list of unknown length) fetches it first: a graph break.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from eclectus.adapters.langchain.pieces import Spread, Symbolic
from eclectus.adapters.pyeval import calls, operators
from eclectus.adapters.pyeval.frame import Frame
from eclectus.adapters.pyeval.host import MAX_DEPTH, Host
from eclectus.adapters.pyeval.source import Source, function_source
from eclectus.adapters.pyeval.values import Deferred, is_symbolic, make_text

_BREAK, _CONTINUE, _RETURN = object(), object(), object()


class Evaluator:
    """Runs one call of one function (see the module). Mutates its frame and, through
    the host, the run's graph."""

    def __init__(self, fn: types.FunctionType, source: Source, host: Host) -> None:
        self.fn = fn
        self.source = source
        self.host = host
        self.frame = Frame(fn, source)
        self.line = getattr(source.node, "lineno", 0)
        self.returned: Any = None

    # -- entry --------------------------------------------------------------------------

    def run(self, arguments: dict[str, Any]) -> Any:
        """The call's result for ``arguments`` (parameter name -> value, bound as Python
        binds them)."""
        for name, value in arguments.items():
            self.frame.store(name, value)
        self.host.ctx.trace.python(f"{self.fn.__qualname__}: evaluated (Python, partially)")
        if self._block(self.source.body) is _RETURN:
            return self.returned
        return None

    def where(self) -> str:
        return f"{self.fn.__qualname__} line {self.line}"

    def concrete(self, value: Any, reason: str) -> Any:
        """``value`` fetched where the evaluation stands (a graph break if it must)."""
        return self.host.concrete(value, self.where(), reason)

    def evaluate_helper(
        self, fn: types.FunctionType, bound: list[Any], args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        """A call of the app's own function ``fn`` (``bound``: a method's ``self``):
        evaluated the same way (an ``async def`` gives a Deferred), or run as Python when
        it cannot be (its arguments fetched first)."""
        source = function_source(fn)
        if isinstance(source, Source) and not source.reasons and self.host.depth < MAX_DEPTH:
            arguments = _bind(fn, [*bound, *args], kwargs)
            if arguments is not None:
                if not source.is_async:
                    return self._nested(fn, source, arguments)

                def real() -> Any:  # the app's own coroutine, for code that is not ours
                    why = f"{fn.__qualname__} awaited as Python"
                    return fn(*bound, *self.concrete(args, why), **self.concrete(kwargs, why))

                return Deferred(lambda: self._nested(fn, source, arguments), real)
        why = source if isinstance(source, str) else "; ".join(source.reasons) or "too deep"
        if is_symbolic(args) or is_symbolic(kwargs):
            self.host.ctx.trace.python(f"{fn.__qualname__}: runs as Python ({why})")
        args = self.concrete(args, f"{fn.__qualname__} runs as Python ({why})")
        kwargs = self.concrete(kwargs, f"{fn.__qualname__} runs as Python ({why})")
        return fn(*bound, *args, **kwargs)

    def _nested(self, fn: types.FunctionType, source: Source, bound: dict[str, Any]) -> Any:
        self.host.depth += 1
        try:
            return Evaluator(fn, source, self.host).run(bound)
        finally:
            self.host.depth -= 1

    # -- statements -----------------------------------------------------------------------

    def _block(self, body: list[ast.stmt]) -> object | None:
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
        return _BREAK

    def _Continue(self, node: ast.Continue) -> object:
        return _CONTINUE

    def _Return(self, node: ast.Return) -> object:
        self.returned = self.eval(node.value) if node.value is not None else None
        return _RETURN

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
        return self._block(branch)

    def _While(self, node: ast.While) -> object | None:
        while operators.truth(self, self.eval(node.test)):
            signal = self._block(node.body)
            if signal is _BREAK:
                return None
            if signal is _RETURN:
                return signal
        return self._block(node.orelse)

    def _For(self, node: ast.For) -> object | None:
        for item in self._iterate(self.eval(node.iter), "a loop over"):
            self.assign(node.target, item)
            signal = self._block(node.body)
            if signal is _BREAK:
                return None
            if signal is _RETURN:
                return signal
            self.line = node.lineno
        return self._block(node.orelse)

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

    # -- expressions --------------------------------------------------------------------

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

        def add(ev: Evaluator) -> None:
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
        self, generators: list[ast.comprehension], emit: Callable[[Evaluator], None]
    ) -> None:
        first = self._iterate(self.eval(generators[0].iter), "iterating")
        self._scope(generators)._loop(generators, 0, first, emit)

    def _loop(
        self,
        generators: list[ast.comprehension],
        index: int,
        it: Iterator[Any],
        emit: Callable[[Evaluator], None],
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

    def _scope(self, generators: list[ast.comprehension]) -> Evaluator:
        """An evaluator for a comprehension's own scope: its targets are its own
        variables, everything else the function's (Python 3's comprehension scope)."""
        child = Evaluator.__new__(Evaluator)
        child.fn, child.source, child.host = self.fn, self.source, self.host
        child.line, child.returned = self.line, None
        child.frame = self.frame.child(
            {n.id for g in generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        )
        return child


def _bind(fn: types.FunctionType, args: list[Any], kwargs: dict[str, Any]) -> dict | None:
    """Parameter name -> value as Python binds them; None when they do not bind (the call
    then runs as Python, raising Python's own TypeError)."""
    import inspect

    try:
        bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def _has_spread(items: list[Any]) -> bool:
    return any(isinstance(i, Spread) for i in items)


def _consumes(node: ast.Call) -> bool:
    """A call that takes a generator argument whole, right away: ``sep.join(...)``,
    ``list(...)``, ``tuple(...)`` (decided from its syntax; checked again at the call)."""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "join":
        return isinstance(func.value, ast.Constant) and isinstance(func.value.value, str)
    return isinstance(func, ast.Name) and func.id in ("list", "tuple")


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
