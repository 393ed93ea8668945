"""Semantic functions: template parsing, argument checks, and the fragment a call builds
(observed in the submit frame the recording peer receives)."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest
from client_peer import FakePeer

from eclectus.adapters.client import Gen, SamplingParams, SemanticVariable, Session
from eclectus.adapters.client.functions import to_sampling


def only_submit(peer: FakePeer) -> dict[str, Any]:
    (submit,) = peer.of_type("submit")
    return submit


async def test_template_becomes_text_var_and_gen_segments(
    peer: FakePeer, peer_app: Session
) -> None:
    """Constants and str inputs travel as text, variable inputs as var, outputs as gen."""
    ask = peer_app.function("Q: {{q}} Ctx: {{ctx}} A:{{a}}", a=dict(max_tokens=8, stop="\n"))
    ctx = peer_app.variable("some context")
    answer = ask(q="why?", ctx=ctx)
    assert isinstance(answer, SemanticVariable) and answer.name == "a"
    await peer_app.flush()
    (call,) = only_submit(peer)["calls"]
    assert call["segments"] == [
        {"text": "Q: "},
        {"text": "why?"},
        {"text": " Ctx: "},
        {"var": ctx.id},
        {"text": " A:"},
        {"gen": answer.id, "sampling": {"max_tokens": 8, "stop": ["\n"]}},
    ]


async def test_multi_output_returns_tuple_in_template_order(
    peer: FakePeer, peer_app: Session
) -> None:
    """Several outputs -> a tuple in template order, each declared with its name."""
    f = peer_app.function("{{x}} T:{{title}} B:{{body}}", body=dict(max_tokens=4), title={})
    title, body = f(x="doc")
    assert (title.name, body.name) == ("title", "body")
    assert f.output_names == ("title", "body") and f.input_names == ("x",)
    await peer_app.flush()
    submit = only_submit(peer)
    assert [v["id"] for v in submit["vars"]] == [title.id, body.id]
    gens = [s["gen"] for s in submit["calls"][0]["segments"] if "gen" in s]
    assert gens == [title.id, body.id]


@pytest.mark.parametrize(
    ("template", "outputs"),
    [
        ("Q: {{q A:{{a}}", {"a": {}}),  # unbalanced braces
        ("{{a}} and {{a}}", {"a": {}}),  # a name twice
        ("{{1x}}", {"1x": {}}),  # not an identifier
        ("Q: {{q}}", {}),  # no output
        ("Q: {{q}}", {"zzz": {}}),  # output is not a placeholder
        ("Q: {{q}} {{a}}", {"a": {"max_tokens": 0}}),  # invalid spec
    ],
)
async def test_bad_template_raises_value_error_at_definition(
    peer_app: Session, template: str, outputs: dict[str, Any]
) -> None:
    """Bad templates and specs fail at app.function(), before anything is sent."""
    with pytest.raises(ValueError):
        peer_app.function(template, outputs=outputs)
    assert peer_app.num_pending == 0


async def test_bad_arguments_raise_type_error_naming_the_argument(peer_app: Session) -> None:
    """Missing, unknown, output-named and ill-typed inputs are TypeErrors naming the input."""
    f = peer_app.function("{{doc}} -> {{summary}}", summary=dict(max_tokens=4))
    with pytest.raises(TypeError, match="doc"):
        f()
    with pytest.raises(TypeError, match="extra"):
        f(doc="x", extra="y")
    with pytest.raises(TypeError, match="summary"):
        f(doc="x", summary="y")
    with pytest.raises(TypeError, match="doc"):
        f(doc=42)  # type: ignore[arg-type]
    assert peer_app.num_pending == 0


async def test_variable_of_another_session_is_refused(peer: FakePeer) -> None:
    """A variable cannot cross sessions: the server would not know its id."""
    from eclectus.adapters.client import connect

    async with connect(peer.url) as one, connect(peer.url) as two:
        foreign = one.variable("x")
        f = two.function("{{a}}{{b}}", b={})
        with pytest.raises(TypeError, match="another session"):
            f(a=foreign)
        with pytest.raises(ValueError, match="another session"):
            two.join([foreign])


async def test_call_segment_form_with_gen(peer: FakePeer, peer_app: Session) -> None:
    """app.call takes str / variable / Gen pieces and returns the outputs in order."""
    topic = peer_app.variable(name="topic")
    first, second = peer_app.call(
        ["About ", topic, ": ", Gen(max_tokens=3, name="one"), " and ", Gen(seed=7)],
        model="tiny",
    )
    await peer_app.flush()
    submit = only_submit(peer)
    assert submit["vars"][0] == {"id": topic.id, "name": "topic"}
    (call,) = submit["calls"]
    assert call["model"] == "tiny"
    assert call["segments"][1] == {"var": topic.id}
    assert call["segments"][3] == {"gen": first.id, "sampling": {"max_tokens": 3}}
    assert call["segments"][5] == {"gen": second.id, "sampling": {"seed": 7}}
    with pytest.raises(ValueError, match="output"):
        peer_app.call(["no output here"])
    with pytest.raises(TypeError):
        peer_app.call([3])  # type: ignore[list-item]


async def test_join_and_repr_list_declare_ops(peer: FakePeer, peer_app: Session) -> None:
    """join/repr_list become OpSpecs; str items become constant variables."""
    a = peer_app.variable("A")
    joined = peer_app.join([a, "B"], sep=", ", prefix="[", suffix="]")
    listed = peer_app.repr_list([a])
    await peer_app.flush()
    submit = only_submit(peer)
    join_op, repr_op = submit["ops"]
    constant_b = submit["vars"][1]
    assert constant_b["value"] == "B"
    assert join_op["op"] == "join" and join_op["inputs"] == [a.id, constant_b["id"]]
    assert (join_op["output"], join_op["sep"], join_op["prefix"]) == (joined.id, ", ", "[")
    assert (repr_op["op"], repr_op["inputs"], repr_op["output"]) == ("repr_list", [a.id], listed.id)


async def test_ids_are_unique_across_threads(peer_app: Session) -> None:
    """Concurrent declarations from many threads never reuse an id or lose a call."""
    f = peer_app.function("{{x}}:{{y}}", y=dict(max_tokens=1))
    made: list[SemanticVariable] = []
    lock = threading.Lock()

    def work() -> None:
        local = [f(x=str(i)) for i in range(50)]
        with lock:
            made.extend(v for v in local if isinstance(v, SemanticVariable))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({v.id for v in made}) == 200
    assert peer_app.num_pending == 400  # 200 output vars + 200 calls


def test_to_sampling_accepts_dicts_specs_and_true() -> None:
    """Sampling specs come as dicts, SamplingParams or True; bad types are TypeErrors."""
    assert to_sampling(True, "x") == SamplingParams()
    assert to_sampling({"stop": "END"}, "x").stop == ("END",)
    spec = SamplingParams(max_tokens=3)
    assert to_sampling(spec, "x") is spec
    with pytest.raises(TypeError):
        to_sampling(3, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="either"):
        Gen(sampling=spec, max_tokens=3)


def test_sdk_imports_no_torch() -> None:
    """A client-only install works: importing the SDK pulls in no torch, numpy or engine."""
    code = (
        "import sys, eclectus.adapters.client\n"
        "heavy = [m for m in ('torch', 'numpy', 'transformers', 'eclectus.server.engine')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
