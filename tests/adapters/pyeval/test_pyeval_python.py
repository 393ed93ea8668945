"""The evaluator on concrete values is Python: the same results, side effects in the same
order, the same exceptions. No server: with no model call nothing symbolic arises, so these
exercise the interpreter, its native expressions and the pre-pass alone."""

# The functions under test are written the ways Python allows, not the ways ruff prefers:
# ruff: noqa: B023, UP031, UP032, RUF021, F841

from __future__ import annotations

import asyncio
import linecache
import re
import textwrap
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.adapters.langchain.compiler.context import Lowering
from eclectus.adapters.pyeval import NotEvaluable, evaluate
from eclectus.adapters.pyeval.source import function_source

EFFECTS: list[Any] = []
COUNTER = {"n": 0}


def evaluated(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` through the evaluator (no session: nothing is symbolic)."""
    ctx = Lowering(None, ("", None), "sync", {})  # type: ignore[arg-type]
    return asyncio.run(evaluate(fn, list(args), kwargs, ctx))


def same(fn: Any, *args: Any, **kwargs: Any) -> None:
    """The evaluator and Python agree on the result, or on the exception, and on the side
    effects (EFFECTS, in order)."""
    outcomes = []
    for run in (lambda: fn(*args, **kwargs), lambda: evaluated(fn, *args, **kwargs)):
        EFFECTS.clear()
        COUNTER["n"] = 0
        try:
            outcome: Any = ("value", run())
        except Exception as exc:  # compared by type and message
            outcome = ("raised", type(exc), str(exc))
        outcomes.append((outcome, list(EFFECTS), COUNTER["n"]))
    assert outcomes[0] == outcomes[1]


def bump() -> int:
    COUNTER["n"] += 1
    return COUNTER["n"]


def note(value: Any) -> Any:
    EFFECTS.append(value)
    return value


def statements(items: list[int], limit: int = 3, *rest: int, scale: int = 2, **extra: Any) -> Any:
    total = 0
    seen = []
    for i, item in enumerate(items):
        if item < 0:
            continue
        if i >= limit:
            break
        total += item * scale
        seen.append(note(item))
    else:
        note("no break")
    while total > 10:
        total -= 7
    first, *middle, last = [*items, *rest] or [0, 0]
    (a, b), c = (first, last), len(middle)
    d = {"a": a, **extra}
    d["b"] = b
    d["b"] += c
    del d["a"]
    assert total >= 0, "negative"
    return total, seen, d, a if a > b else b, [x for x in items if x % 2], {x: x * x for x in rest}


def closures(n: int) -> Any:
    scale = 2
    double = lambda x: x * scale  # noqa: E731 (late binding: sees the later scale)
    scale = 3
    makers = [lambda: i for i in range(n)]  # the comprehension's own i
    i = 10
    gen = (note(j) for j in range(n))  # lazy: effects as consumed
    note("before")
    consumed = list(gen)
    return double(5), [m() for m in makers], i, consumed, sum(k for k in range(n))


def strings(word: str, width: int) -> Any:
    parts = [
        f"{word!r:>{width}}",
        f"{width:04d}",
        "%s-%r" % (word, word),
        "{0}:{w}".format(1, w=word),
    ]
    parts.append(word.strip().upper()[:3] + "." * (width % 3))
    return " | ".join(parts), 1 < width < 10 != width, width > 3 and word or "short"


def globals_and_helpers(k: int) -> Any:
    before = COUNTER["n"]
    values = [bump() for _ in range(k)]
    return before, values, COUNTER["n"], helper_chain(k)


def helper_chain(k: int) -> int:
    return k if k <= 0 else helper_chain(k - 1) + 1


def unbound(flag: bool) -> Any:
    if flag:
        value = 1
    return value  # UnboundLocalError when not flag


def raises(kind: str) -> Any:
    note("start")
    if kind == "key":
        return {}["missing"]
    if kind == "type":
        return "a" + 1  # type: ignore[operator]
    if kind == "raise":
        raise ValueError(f"bad {kind}") from KeyError(kind)
    if kind == "unpack":
        x, y = [1, 2, 3]
    return undefined_name  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (statements, ([3, -1, 4, 1, 5],), {}),
        (statements, ([2, 2],), {"scale": 5, "extra": 1}),
        (statements, ([], 0, 7, 8), {"q": 3}),
        (statements, ([9, 9, 9, 9],), {"limit": 9}),
        (closures, (3,), {}),
        (strings, (" tide ", 7), {}),
        (strings, ("x", 2), {}),
        (globals_and_helpers, (3,), {}),
        (unbound, (True,), {}),
        (unbound, (False,), {}),
        (raises, ("key",), {}),
        (raises, ("type",), {}),
        (raises, ("raise",), {}),
        (raises, ("unpack",), {}),
        (raises, ("name",), {}),
    ],
)
def test_concrete_code_is_python(fn: Any, args: tuple, kwargs: dict) -> None:
    same(fn, *args, **kwargs)


def test_arguments_that_do_not_bind_are_left_to_python() -> None:
    """Python's own TypeError: the caller runs the function as Python."""
    with pytest.raises(NotEvaluable, match="do not bind"):
        evaluated(statements)


def with_try(x: int) -> int:
    note("ran")
    try:
        return x
    finally:
        note("finally")


class _Holder:
    def method(self) -> None:
        class Inner:
            pass

        with open(__file__):
            pass


def generator(n: int) -> Any:
    yield n


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (with_try, "a try statement"),
        (_Holder.method, "a class body"),
        (generator, "yield (a generator)"),
    ],
)
def test_the_pre_pass_names_what_runs_as_python(fn: Any, reason: str) -> None:
    """Decided from the code before anything runs: the function is never half-run."""
    source = function_source(fn)
    assert not isinstance(source, str) and any(reason in r for r in source.reasons)
    assert all(r.startswith("line ") for r in source.reasons)
    EFFECTS.clear()
    with pytest.raises(NotEvaluable, match=re.escape(reason)):
        evaluated(fn, 1) if fn is not _Holder.method else evaluated(fn, _Holder())
    assert EFFECTS == []  # nothing of it ran


def test_a_function_without_source_is_left_to_python() -> None:
    namespace: dict[str, Any] = {}
    exec("def made(x):\n    return x + 1\n", namespace)
    with pytest.raises(NotEvaluable, match="no source"):
        evaluated(namespace["made"], 1)


# -- a generated corpus of concrete programs ------------------------------------------------

NAMES = ["a", "b", "c"]
ATOMS = st.sampled_from(["a", "b", "c", "1", "2", "-3", "'x'", "'yz'", "len(a)", "bump()"])
EXPRESSIONS = st.recursive(
    ATOMS,
    lambda inner: st.one_of(
        st.builds(lambda x, y, op: f"({x} {op} {y})", inner, inner, st.sampled_from("+-*%")),
        st.builds(lambda x, y: f"({x} if {y} else {x})", inner, inner),
        st.builds(lambda x, y: f"({x} < {y} <= {x})", inner, inner),
        st.builds(lambda x, y: f"({x} or {y})", inner, inner),
        st.builds(lambda x: f"note({x})", inner),
        st.builds(lambda x: f"str({x})", inner),
        st.builds(lambda x: f'f"<{{{x}!r:>5}}>"', ATOMS),  # f-strings do not nest in 3.11
        st.builds(lambda x: f"[v for v in [{x}, {x}] if v]", inner),
    ),
    max_leaves=6,
)
STATEMENTS = st.one_of(
    st.builds(lambda n, e: f"{n} = {e}", st.sampled_from(NAMES), EXPRESSIONS),
    st.builds(lambda n, e: f"{n} += {e}", st.sampled_from(NAMES), EXPRESSIONS),
    st.builds(lambda e: f"if {e}:\n    note('then')\nelse:\n    note('else')", EXPRESSIONS),
    st.builds(lambda e: f"for i in range(2):\n    note(({e}, i))", EXPRESSIONS),
)


_PROGRAMS = 0


def define(body: list[str]) -> Any:
    """A function ``program(a, b, c)`` of ``body``, with a source the evaluator can read
    (registered in linecache under a file name of its own)."""
    global _PROGRAMS
    _PROGRAMS += 1
    filename = f"<pyeval-corpus-{_PROGRAMS}>.py"
    lines = ["def program(a, b, c):", *(textwrap.indent(s, "    ") for s in body)]
    lines += ["    return a, b, c", ""]
    text = "\n".join(lines)
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace: dict[str, Any] = {"note": note, "bump": bump, "__name__": "pyeval_corpus"}
    exec(compile(text, filename, "exec"), namespace)
    return namespace["program"]


@settings(max_examples=150, deadline=None)
@given(st.lists(STATEMENTS, min_size=1, max_size=5), st.sampled_from([("", 1, 2), ("q", 0, "r")]))
def test_generated_concrete_programs_are_python(body: list[str], args: tuple) -> None:
    same(define(body), *args)


@settings(max_examples=40, deadline=None)
@given(st.lists(STATEMENTS, min_size=1, max_size=4))
def test_generated_programs_with_a_try_run_as_python(body: list[str]) -> None:
    """A construct the evaluator does not implement makes the whole function Python."""
    block = [textwrap.indent(s, "    ") for s in body]
    program = define(["try:", *block, "except Exception:", "    pass"])
    with pytest.raises(NotEvaluable, match="try"):
        evaluated(program, "", 1, 2)
