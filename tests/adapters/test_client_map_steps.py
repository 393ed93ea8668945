"""MapSteps: a map's per-element pipeline built call by call, and the MapSpec it ships
(observed in the submit frame the recording peer receives); its misuse is a ValueError
naming what was wrong, before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest
from client_peer import FakePeer
from hypothesis import given, settings
from hypothesis import strategies as st

from eclectus.adapters.client import Gen, MapSteps, Session
from eclectus.adapters.client.declarations import Declarations
from eclectus.protocol import MAX_MAP_STEPS, MapSpec


class Offline(Declarations):
    """The declaring half of a session alone: no connection, never closed."""

    def _closed_reason(self) -> BaseException | None:
        return None


def only_map(peer: FakePeer) -> dict[str, Any]:
    (submit,) = peer.of_type("submit")
    (spec,) = submit["maps"]
    return spec


async def test_steps_ship_as_call_then_and_step_outputs(peer: FakePeer, peer_app: Session) -> None:
    """Three steps: call is the first, then the others, each step's local output read by the
    later ones; the map's output and step outputs are declared, the locals are not."""
    items = peer_app.variable('["a.py", "b.py"]')
    design = peer_app.variable("design")
    element = peer_app.new_variable(name="element")
    steps = peer_app.map_steps(element)
    code = steps.call(["Write ", element, " for ", design, Gen(max_tokens=6)])
    review = steps.call(["Review ", code, Gen(max_tokens=4)])
    final = steps.call(["Revise ", code, " per ", review, Gen(max_tokens=6)], model="tiny")
    mapped, earlier = peer_app.map_pipeline(items, steps, step_outputs=True)
    assert steps.num_steps == 3 and len(earlier) == 2
    await peer_app.flush()
    spec = only_map(peer)
    assert spec["call"]["segments"][1] == {"var": element.id}
    assert [s for s in spec["then"][0]["segments"] if "var" in s] == [{"var": code.id}]
    assert spec["then"][1]["model"] == "tiny"
    assert spec["then"][1]["segments"][-1]["gen"] == final.id
    assert spec["output"] == mapped.id and spec["step_outputs"] == [v.id for v in earlier]
    (submit,) = peer.of_type("submit")
    declared = {v["id"] for v in submit["vars"]}
    assert {mapped.id, *(v.id for v in earlier)} <= declared
    assert not declared & {element.id, code.id, review.id, final.id}


async def test_map_takes_steps_and_returns_the_last_steps_array(
    peer: FakePeer, peer_app: Session
) -> None:
    """session.map with a MapSteps: the same MapSpec, without step outputs."""
    items = peer_app.variable("[1]")
    element = peer_app.new_variable()
    steps = peer_app.map_steps(element)
    first = steps.call([element, Gen(max_tokens=2)])
    steps.call([first, Gen(max_tokens=2)])
    mapped = peer_app.map(items, element, steps, items_path=["x"])
    await peer_app.flush()
    spec = only_map(peer)
    assert spec["output"] == mapped.id and spec["items_path"] == ["x"]
    assert len(spec["then"]) == 1 and "step_outputs" not in spec


async def test_one_step_is_todays_one_call_map(peer: FakePeer, peer_app: Session) -> None:
    """A one-step builder and a piece list ship the same map fields (then, step_outputs
    left out): a one-call map is byte-for-byte what it was before steps existed."""
    items = peer_app.variable("[1]")
    element = peer_app.new_variable()
    peer_app.map(items, element, ["Do ", element, Gen(max_tokens=3)])
    steps = peer_app.map_steps(element)
    steps.call(["Do ", element, Gen(max_tokens=3)])
    _, earlier = peer_app.map_pipeline(items, steps, step_outputs=True)
    assert earlier == []
    await peer_app.flush()
    (submit,) = peer.of_type("submit")
    plain, piped = submit["maps"]
    assert set(plain) == set(piped) == {"id", "items", "element", "call", "output"}
    assert plain["call"]["segments"][:2] == piped["call"]["segments"][:2]


def bad_uses(app: Session) -> dict[str, tuple[Any, str]]:
    """Misuses of a builder, each a thunk and the words its ValueError must hold."""
    items, element, other = app.variable("[]"), app.new_variable(), app.new_variable()
    steps, stranger = app.map_steps(element), app.map_steps(other)
    local = steps.call([element, Gen(max_tokens=2)])
    return {
        "two gens": (lambda: steps.call([Gen(), Gen()]), "exactly one Gen output, not 2"),
        "no gen": (lambda: steps.call(["x"]), "at least one Gen"),
        "foreign local": (lambda: stranger.call([local, Gen()]), "map_steps builder"),
        "local in a call": (lambda: app.call([local, Gen()]), "only that builder's later"),
        "local in a join": (lambda: app.join([local]), "map_steps builder"),
        "local as items": (lambda: app.map(local, element, [element, Gen()]), "builder"),
        "model with steps": (lambda: app.map(items, element, steps, model="m"), "model="),
        "other element": (lambda: app.map(items, other, steps), "was built for"),
        "no steps": (lambda: app.map_pipeline(items, stranger), "has no steps"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "two gens",
        "no gen",
        "foreign local",
        "local in a call",
        "local in a join",
        "local as items",
        "model with steps",
        "other element",
        "no steps",
    ],
)
async def test_a_misused_builder_is_a_value_error(peer_app: Session, case: str) -> None:
    """Each misuse raises ValueError naming the problem; nothing is declared by it."""
    thunk, words = bad_uses(peer_app)[case]
    before = peer_app.num_pending
    with pytest.raises(ValueError, match=words):
        thunk()
    assert peer_app.num_pending == before


async def test_a_local_cannot_be_asked_for(peer_app: Session) -> None:
    """A step's output has no value of its own on the server: a get is refused at once."""
    steps = peer_app.map_steps(peer_app.new_variable())
    local = steps.call(["x", Gen(max_tokens=1)])
    with pytest.raises(ValueError, match="map_steps builder"):
        await local.aget()


async def test_at_most_max_map_steps(peer_app: Session) -> None:
    """The builder refuses the step past MAX_MAP_STEPS, as the wire model would."""
    element = peer_app.new_variable()
    steps = peer_app.map_steps(element)
    for _ in range(MAX_MAP_STEPS):
        steps.call([element, Gen(max_tokens=1)])
    with pytest.raises(ValueError, match="at most 16 steps"):
        steps.call([element, Gen(max_tokens=1)])
    assert isinstance(steps, MapSteps) and "steps=16" in repr(steps)


@settings(max_examples=20, deadline=None)
@given(num_steps=st.integers(min_value=1, max_value=MAX_MAP_STEPS), outputs=st.booleans())
def test_any_pipeline_is_a_valid_map_spec(num_steps: int, outputs: bool) -> None:
    """Whatever its length, a builder's spec validates on the wire, each step reading the
    one before it, with step outputs for every step but the last."""
    app = Offline()
    element = app.new_variable()
    steps = app.map_steps(element)
    previous = element
    for _ in range(num_steps):
        previous = steps.call([previous, Gen(max_tokens=1)])
    mapped, earlier = app.map_pipeline(app.variable("[]"), steps, step_outputs=outputs)
    (spec,) = app._pending.take().maps
    MapSpec.model_validate(spec.model_dump())
    assert len(spec.then) == num_steps - 1 and spec.output == mapped.id
    assert spec.step_outputs == ([v.id for v in earlier] if outputs else [])
    assert len(earlier) == (num_steps - 1 if outputs else 0)


def test_retracting_a_map_takes_back_its_step_outputs_too() -> None:
    """retract([mapped]) removes the map and every variable it would output (its step
    outputs included), so nothing of the given-up fan-out ships."""
    app = Offline()
    items = app.variable('["a.py"]')
    element = app.new_variable(name="element")
    steps = app.map_steps(element)
    code = steps.call(["Write ", element, Gen(max_tokens=6)])
    steps.call(["Review ", code, Gen(max_tokens=4)])
    before = app.num_pending
    mapped, step_vars = app.map_pipeline(items, steps, step_outputs=True)
    assert app.num_pending == before + 1 + 1 + len(step_vars)  # the map, its output, steps
    assert app.retract([mapped]) == 1
    assert app.num_pending == before
