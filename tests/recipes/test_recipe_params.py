"""The typed parameter parser that `eclectus run --param` and `eclectus eval --set` share."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from eclectus.cli import main
from eclectus.recipes import MapReduceParams, SharedPromptParams
from eclectus.recipes.params import parse_field, replace_path, resolve, set_from_text


@dataclass(frozen=True)
class Toggles:
    """Field types the recipes do not use yet, to cover the parser's other branches."""

    verbose: bool = False
    label: str = "x"
    ids: tuple[int, ...] = ()


def test_values_follow_the_declared_type() -> None:
    """ "4" is 4 for an int field and 4.0 for a float field; "none" only where None is allowed."""
    assert parse_field(MapReduceParams, "chunk_tokens", "4") == 4
    assert type(parse_field(SharedPromptParams, "rate", "4")) is float
    assert parse_field(MapReduceParams, "num_chunks", "none") is None
    assert parse_field(SharedPromptParams, "background", "None") is None
    assert parse_field(SharedPromptParams, "background.width", "3") == 3
    assert parse_field(Toggles, "label", "12") == "12"


@pytest.mark.parametrize(
    ("text", "expected"), [("true", True), ("ON", True), ("1", True), ("no", False), ("0", False)]
)
def test_bools_take_yes_no_words(text: str, expected: bool) -> None:
    """A bool takes true/false, yes/no, on/off, 1/0 in any case."""
    assert parse_field(Toggles, "verbose", text) is expected


@pytest.mark.parametrize(
    ("params_type", "path", "text", "message"),
    [
        (MapReduceParams, "chunk_tokens", "2.5", "MapReduceParams.chunk_tokens expects int, got"),
        (MapReduceParams, "chunk_tokens", "none", "chunk_tokens expects int, got 'none'"),
        (MapReduceParams, "num_chunks", "many", "num_chunks expects int or none, got 'many'"),
        (SharedPromptParams, "rate", "fast", "SharedPromptParams.rate expects float, got"),
        (Toggles, "verbose", "maybe", "Toggles.verbose expects bool, got 'maybe'"),
        (SharedPromptParams, "background", "3", "takes none, or its fields as background.FIELD"),
        (MapReduceParams, "chunks", "3", "no field 'chunks'; fields are chunk_tokens,"),
        (SharedPromptParams, "users.width", "3", "SharedPromptParams.users has no fields"),
        (Toggles, "ids", "1,2", "Toggles.ids cannot be set from text"),
    ],
)
def test_bad_input_names_the_field_and_the_type(
    params_type: type, path: str, text: str, message: str
) -> None:
    """Every refusal is a ValueError that says which field and what it takes."""
    with pytest.raises(ValueError, match=message):
        parse_field(params_type, path, text)


def test_set_from_text_reaches_nested_params() -> None:
    """A dotted path sets a nested field; a None on the way is refused by name."""
    params = set_from_text(SharedPromptParams(), "background.num_chunks", "2")
    assert params.background is not None and params.background.num_chunks == 2
    assert resolve(SharedPromptParams, "background.width") == (MapReduceParams, "width")
    with pytest.raises(ValueError, match="background is None"):
        replace_path(SharedPromptParams(background=None), "background.width", 2)


def test_run_cli_reports_a_mistyped_param(capsys: pytest.CaptureFixture[str]) -> None:
    """`eclectus run` exits 2 before starting anything, naming the flag, field and type."""
    assert main(["run", "shared-prompt", "--param", "rate=fast", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--param 'rate=fast': SharedPromptParams.rate expects float, got 'fast'" in err
    assert main(["run", "map-reduce", "--param", "num_chunks"]) == 2
    assert "--param takes FIELD=VALUE" in capsys.readouterr().err
