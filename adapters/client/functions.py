"""Semantic functions: a ``{{name}}`` template whose outputs the model generates.

``app.function(template, **outputs)`` parses the template once, with the protocol's own
:func:`~eclectus.protocol.parse_template`, so a template the server would reject is a
``ValueError`` here, before anything is sent. Calling the function turns the parsed skeleton
into one ``CallSpec`` in segment form and appends it to the session's pending fragment:

- a constant text piece of the template -> ``{"text": ...}``;
- an input given a ``str`` -> ``{"text": ...}`` (no variable needed for a constant);
- an input given a SemanticVariable -> ``{"var": id}`` (the server resolves it);
- an output -> ``{"gen": new id, "sampling": ...}`` plus a named ``VarSpec``.

``app.call([...])`` is the same in low-level form: a list of ``str``, SemanticVariable and
:class:`Gen` pieces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from eclectus.adapters.client.variables import SemanticVariable
from eclectus.protocol import (
    CallSpec,
    GenSegment,
    SamplingParams,
    Segment,
    StructuredOutputs,
    TextSegment,
    VarSegment,
    VarSpec,
    parse_template,
    template_placeholders,
)

if TYPE_CHECKING:
    from eclectus.adapters.client.session import Session


class SamplingArgs(TypedDict, total=False):
    """The fields of :class:`~eclectus.protocol.SamplingParams`, as keyword arguments (for
    type checkers; a test keeps the keys equal to the contract's fields). Unset fields take
    the contract's defaults: ``max_tokens`` None generates until EOS or the context window."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str] | str
    stop_token_ids: list[int]
    ignore_eos: bool
    structured_outputs: StructuredOutputs | Mapping[str, Any] | None
    skip_special_tokens: bool


class GenArgs(SamplingArgs, total=False):
    """SamplingArgs plus the structured-output shorthands, each one meaning
    ``structured_outputs={...}`` (one at most): what ``Gen`` and output specs accept."""

    json_schema: dict[str, Any] | str | type
    json_object: bool
    regex: str
    choice: list[str]
    grammar: str


# SDK shorthand -> the StructuredOutputs key it sets (vLLM's names on the wire)
CONSTRAINT_KEYS = {
    "json_schema": "json",
    "json_object": "json_object",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}

SamplingLike = SamplingParams | Mapping[str, Any] | bool


def to_sampling(spec: SamplingLike, where: str) -> SamplingParams:
    """Normalises a sampling spec given as a SamplingParams, a dict, or ``True`` (defaults).
    A lone ``stop`` string becomes a one-element list. Raises ValueError naming ``where``
    for invalid values and TypeError for other types (pure)."""
    if isinstance(spec, SamplingParams):
        return spec
    if spec is True:
        return SamplingParams()
    if not isinstance(spec, Mapping):
        raise TypeError(f"{where}: a sampling spec must be a dict or SamplingParams, not {spec!r}")
    fields = dict(spec)
    if isinstance(fields.get("stop"), str):
        fields["stop"] = [fields["stop"]]
    constraint = {CONSTRAINT_KEYS[k]: fields.pop(k) for k in list(fields) if k in CONSTRAINT_KEYS}
    if constraint:
        if "structured_outputs" in fields:
            raise ValueError(f"{where}: give structured_outputs= or a shorthand, not both")
        fields["structured_outputs"] = constraint
    try:
        return SamplingParams.model_validate(fields)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"{where}: invalid sampling spec: {exc}") from exc


class Gen:
    """Marks an output in :meth:`Session.call`: the model generates a new variable here.

    ``Gen(max_tokens=32, stop="\\n", name="answer")``; ``sampling=`` takes a ready
    SamplingParams instead of keywords. A constraint keyword (``json_schema=`` a schema dict
    or Pydantic class, ``json_object=True``, ``regex=``, ``choice=``, ``grammar=``) makes the
    value valid by construction; ``await var.aget(parse=True)`` then returns it parsed.
    Immutable.
    """

    __slots__ = ("_name", "_sampling")

    def __init__(
        self,
        *,
        name: str | None = None,
        sampling: SamplingParams | None = None,
        **kwargs: Unpack[GenArgs],
    ) -> None:
        if sampling is not None and kwargs:
            raise TypeError("Gen takes either sampling= or sampling keywords, not both")
        self._name = name
        self._sampling = sampling if sampling is not None else to_sampling(kwargs, "Gen")

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def sampling(self) -> SamplingParams:
        return self._sampling

    def __repr__(self) -> str:
        return f"Gen(name={self._name!r}, sampling={self._sampling!r})"


Piece = str | SemanticVariable | Gen


def declare_call(
    session: Session,
    pieces: Sequence[Piece],
    model: str | None = None,
    add_special_tokens: bool = True,
) -> list[SemanticVariable]:
    """Appends one call built from ``pieces`` to the session's pending fragment and returns
    its output variables in order (mutates the pending fragment). Raises ValueError for a
    call without outputs or a variable of another session, TypeError for a foreign piece."""
    call, outputs = call_spec(session, pieces, model, add_special_tokens=add_special_tokens)
    session.declare([VarSpec(id=v.id, name=v.name) for v in outputs], call=call)
    return outputs


def call_spec(
    session: Session,
    pieces: Sequence[Piece],
    model: str | None = None,
    builder: str | None = None,
    *,
    add_special_tokens: bool = True,
) -> tuple[CallSpec, list[SemanticVariable]]:
    """The CallSpec of ``pieces`` and its new output variables (declares nothing; mutates
    only the id counter). ``builder``: the MapSteps whose step this is, whose local outputs
    the pieces may read (map_steps.py). ``add_special_tokens``: CallSpec's (False for a
    rendered chat template). Raises as declare_call, and ValueError for a map step's local
    output read outside its builder."""
    segments: list[Segment] = []
    outputs: list[SemanticVariable] = []
    for piece in pieces:
        if isinstance(piece, str):
            if piece:  # an empty constant adds nothing but a needless seam
                segments.append(TextSegment(text=piece))
        elif isinstance(piece, SemanticVariable):
            session.check_owned(piece, builder)
            segments.append(VarSegment(var=piece.id))
        elif isinstance(piece, Gen):
            var = session.new_variable(name=piece.name)
            segment = GenSegment(gen=var.id, sampling=piece.sampling)
            var._constraint = segment.sampling.structured_outputs
            outputs.append(var)
            segments.append(segment)
        else:
            raise TypeError(f"a call piece must be str, SemanticVariable or Gen, not {piece!r}")
    if not outputs:
        raise ValueError("a call needs at least one Gen output")
    spec = CallSpec(
        id=session.new_id("c"),
        model=model,
        segments=segments,
        add_special_tokens=add_special_tokens,
    )
    return spec, outputs


class SemanticFunction:
    """A parsed template bound to a session; calling it declares one call (no I/O).

    Immutable after construction; safe to call from several threads.
    """

    def __init__(
        self,
        session: Session,
        template: str,
        outputs: Mapping[str, SamplingLike],
        model: str | None = None,
    ) -> None:
        names = template_placeholders(template)  # TemplateError (a ValueError) if malformed
        sampling = {name: to_sampling(spec, f"output {name!r}") for name, spec in outputs.items()}
        if not sampling:
            raise ValueError(
                "a semantic function needs at least one output: give a placeholder a sampling "
                "spec, e.g. app.function('Q: {{q}} A: {{a}}', a=dict(max_tokens=32))"
            )
        # Parse with each placeholder bound to its own name: the skeleton's VarSegment/
        # GenSegment ids are placeholder names, replaced by real ids at each call.
        self._skeleton = parse_template(template, {n: n for n in names}, sampling)
        self._session = session
        self._template = template
        self._model = model
        self._outputs = sampling
        self._input_names = tuple(n for n in names if n not in sampling)
        self._output_names = tuple(n for n in names if n in sampling)

    @property
    def template(self) -> str:
        return self._template

    @property
    def input_names(self) -> tuple[str, ...]:
        """Input placeholders in template order."""
        return self._input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        """Output placeholders in template order (the order of a multi-output result)."""
        return self._output_names

    def __call__(
        self, **inputs: str | SemanticVariable
    ) -> SemanticVariable | tuple[SemanticVariable, ...]:
        """Declares one call; returns the output variable, or a tuple of them in template
        order when the template has several outputs. Sends nothing (mutates the session's
        pending fragment). TypeError names a missing, unknown or ill-typed input."""
        self._check_inputs(inputs)
        pieces: list[Piece] = []
        for segment in self._skeleton:
            if isinstance(segment, TextSegment):
                pieces.append(segment.text)
            elif isinstance(segment, VarSegment):
                pieces.append(inputs[segment.var])
            else:
                pieces.append(Gen(name=segment.gen, sampling=segment.sampling))
        outputs = declare_call(self._session, pieces, self._model)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_inputs(self, inputs: Mapping[str, object]) -> None:
        missing = [n for n in self._input_names if n not in inputs]
        if missing:
            raise TypeError(f"{self!r} missing input(s): {', '.join(missing)}")
        for name, value in inputs.items():
            if name not in self._input_names:
                kind = "an output" if name in self._outputs else "not a placeholder"
                raise TypeError(f"{self!r} got an unexpected input {name!r} ({kind})")
            if not isinstance(value, str | SemanticVariable):
                raise TypeError(
                    f"{self!r} input {name!r} must be str or SemanticVariable, "
                    f"not {type(value).__name__}"
                )
            if isinstance(value, SemanticVariable) and value.session is not self._session:
                raise TypeError(f"{self!r} input {name!r} is a variable of another session")

    def __repr__(self) -> str:
        head = self._template if len(self._template) <= 40 else self._template[:37] + "..."
        return f"SemanticFunction({head!r})"
