"""The pending fragment: atomic takes, and splitting a large fragment into valid submits."""

from __future__ import annotations

import itertools
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.adapters.client.fragment import Fragment, PendingFragment, created_ids, plan_submits
from eclectus.adapters.client.wire import encode_frame
from eclectus.protocol import (
    CLIENT_FRAME,
    CallSpec,
    GenSegment,
    GetSpec,
    MapSpec,
    OpSpec,
    Submit,
    SwitchSpec,
    TextSegment,
    VarSegment,
    VarSpec,
)


def fan_out(doc_sizes: list[int]) -> tuple[Fragment, list[GetSpec]]:
    """A map step over constant docs of the given sizes and a join of the outputs."""
    fragment = Fragment()
    for i, size in enumerate(doc_sizes):
        fragment.vars += [VarSpec(id=f"d{i}", value="x" * size), VarSpec(id=f"s{i}")]
        segments = [TextSegment(text="Sum:"), VarSegment(var=f"d{i}"), GenSegment(gen=f"s{i}")]
        fragment.calls.append(CallSpec(id=f"c{i}", segments=segments))
    inputs = [f"s{i}" for i in range(len(doc_sizes))]
    fragment.ops.append(OpSpec(id="j", op="join", inputs=inputs, output="all"))
    fragment.vars.append(VarSpec(id="all"))
    return fragment, [GetSpec(var="all")]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=30))
def test_split_submits_fit_and_keep_a_valid_order(doc_sizes: list[int]) -> None:
    """Every part fits, nothing is lost or repeated, declarations precede calls, gets last."""
    fragment, gets = fan_out(doc_sizes)
    ids = (f"s{n}" for n in itertools.count())
    submits = plan_submits(fragment, gets, 2_000, lambda: next(ids))
    for submit in submits:
        text = encode_frame(submit)
        assert len(text.encode()) <= 2_000
        CLIENT_FRAME.validate_json(text)  # a valid protocol frame
    assert [v for s in submits for v in s.vars] == fragment.vars
    assert [c for s in submits for c in s.calls] == fragment.calls
    assert [o for s in submits for o in s.ops] == fragment.ops
    assert [g for s in submits for g in s.gets] == gets
    first_call = min(i for i, s in enumerate(submits) if s.calls)
    assert all(not s.vars for s in submits[first_call + 1 :])
    assert submits[-1].gets == gets
    assert len({s.id for s in submits}) == len(submits)


def test_small_fragment_is_one_submit() -> None:
    """Below the limit, the whole fragment and its gets travel together."""
    fragment, gets = fan_out([10, 10, 10])
    (submit,) = plan_submits(fragment, gets, 1 << 20, lambda: "s1")
    assert (submit.id, len(submit.calls), submit.gets) == ("s1", 3, gets)


def test_created_ids_include_call_and_op_outputs() -> None:
    """A rejected submit fails what only it would have created: vars and outputs."""
    fragment, gets = fan_out([1])
    fragment.vars = []  # outputs need not be declared in vars
    submit = fragment.to_submit("s1", gets)
    assert created_ids(submit) == ["s0", "all"]


def test_take_is_atomic_under_concurrent_adds() -> None:
    """Adds from threads racing takes: every declaration is taken exactly once."""
    pending = PendingFragment()
    taken: list[Fragment] = []

    def add() -> None:
        for _ in range(200):
            var_id = pending.new_id("v")
            pending.add([VarSpec(id=var_id)])

    threads = [threading.Thread(target=add) for _ in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken.append(pending.take())
    taken.append(pending.take())
    ids = [v.id for f in taken for v in f.vars]
    assert len(ids) == 600 and len(set(ids)) == 600
    assert len(pending) == 0


def map_fragment(doc_size: int) -> tuple[Fragment, list[GetSpec]]:
    """A large constant plan, a map over it and a spread join of the map's output."""
    fragment = Fragment(vars=[VarSpec(id="plan", value='["' + "x" * doc_size + '"]')])
    call = CallSpec(id="w", segments=[VarSegment(var="e"), GenSegment(gen="r")])
    fragment.maps.append(MapSpec(id="m", items="plan", element="e", call=call, output="done"))
    fragment.vars.append(VarSpec(id="done"))
    fragment.ops.append(OpSpec(id="j", op="join", inputs=["done"], output="all", spread=True))
    fragment.vars.append(VarSpec(id="all"))
    return fragment, [GetSpec(var="all")]


def test_maps_ship_and_split_before_the_ops_that_spread_them() -> None:
    """A map travels in the submit, and a split puts it before its spread op."""
    fragment, gets = map_fragment(10)
    (whole,) = plan_submits(fragment, gets, 1 << 20, lambda: "f")
    assert whole.maps == fragment.maps and "done" in created_ids(whole)
    ids = itertools.count()
    frames = plan_submits(*map_fragment(600), 700, lambda: f"f{next(ids)}")
    order = [item.id for f in frames for item in (*f.maps, *f.ops)]
    assert len(frames) > 1 and order.index("m") < order.index("j")


def test_switches_ship_and_split_after_what_they_guard_and_retract_removes() -> None:
    """A switch travels in the submit; a split puts it after every call, op and map and
    before the gets (the nodes it guards are then idle on the server); retract removes
    pending nodes and their variables."""
    fragment, gets = fan_out([600, 600, 600])
    fragment.switches.append(SwitchSpec(id="w", on="s0", cases={"a": ["c1"], "b": ["c2"]}))
    (whole,) = plan_submits(fragment, gets, 1 << 20, lambda: "f")
    assert whole.switches == fragment.switches
    ids = itertools.count()
    frames = plan_submits(fragment, gets, 900, lambda: f"f{next(ids)}")
    order = [i.id if not isinstance(i, GetSpec) else "get" for f in frames for i in _items(f)]
    assert len(frames) > 1 and order.index("w") > max(order.index(c) for c in ("c0", "j"))
    assert order.index("w") < order.index("get")
    pending = PendingFragment()
    pending.add([VarSpec(id="s1")], fragment.calls[1])
    pending.add([], switch=fragment.switches[0])
    assert pending.retract({"c1", "w", "zz"}, {"s1"}) == 2 and len(pending) == 0


def _items(frame: Submit) -> list[object]:
    return [*frame.calls, *frame.maps, *frame.ops, *frame.switches, *frame.gets]
