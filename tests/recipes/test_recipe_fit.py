"""Sizes that fit the document and the model (recipes/fit.py), as `eclectus run` applies
them, and the progress line of a compiled run (counted from the server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from recipe_support import TEXT

from eclectus.recipes import ChainSummaryParams, MapReduceParams, SharedPromptParams, run_recipe
from eclectus.recipes.embedded import Embedded
from eclectus.recipes.fit import fit_num_chunks, fit_system_prompt
from eclectus.recipes.text import approx_tokens, split_chunks

NOTES = "# Notes\n\nThe meeting went well. We agreed to ship on Friday.\n\nSecond, write docs.\n"


@pytest.mark.parametrize("value", [0, -1])
@pytest.mark.parametrize("params_type", [MapReduceParams, ChainSummaryParams])
def test_num_chunks_below_one_is_refused(params_type: type, value: int) -> None:
    with pytest.raises(ValueError, match=f"num_chunks must be >= 1 .*got {value}"):
        params_type(num_chunks=value)


@given(st.integers(1, 64), st.sampled_from([64, 128, 512]))
def test_a_default_num_chunks_shrinks_to_the_document(num_chunks: int, chunk_tokens: int) -> None:
    """Not given by the user: at most what the text gives, with a note when lowered."""
    notes: list[str] = []
    params = ChainSummaryParams(chunk_tokens=chunk_tokens, num_chunks=num_chunks)
    fitted = fit_num_chunks(params, TEXT, "", given=False, notes=notes)
    available = len(split_chunks(TEXT, chunk_tokens))
    assert fitted.num_chunks == min(num_chunks, available)
    assert len(split_chunks(TEXT, chunk_tokens, fitted.num_chunks)) == fitted.num_chunks
    assert bool(notes) == (num_chunks > available)


def test_a_given_num_chunks_the_document_cannot_give_says_what_to_change() -> None:
    with pytest.raises(ValueError, match=r"--num-chunks 4: the document gives only 1 .*--chunk"):
        fit_num_chunks(ChainSummaryParams(num_chunks=4), NOTES, "", given=True, notes=[])


def test_the_background_job_fits_too() -> None:
    notes: list[str] = []
    fitted = fit_num_chunks(SharedPromptParams(), NOTES, "background", given=False, notes=notes)
    assert fitted.background is not None and fitted.background.num_chunks == 1 and notes


def test_system_prompt_shrinks_to_the_model_or_says_how_far() -> None:
    """Counting bytes (the tiny tokenizer), a default system prompt shrinks under the limit;
    a given one that does not fit is refused with a size that does."""
    text = TEXT * 4
    notes: list[str] = []
    fitted = fit_system_prompt(SharedPromptParams(), text, 1024, approx_tokens, False, notes)
    assert fitted.system_tokens < 2048 and notes
    assert fit_system_prompt(fitted, text, 1024, approx_tokens, True, []) == fitted
    with pytest.raises(ValueError, match=r"system_tokens=2048: .* pass --param system_tokens="):
        fit_system_prompt(SharedPromptParams(), text, 1024, approx_tokens, True, [])


def eclectus_run(*argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "eclectus", "run", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_chain_summary_of_a_short_document(tmp_path: Path) -> None:
    """The docs' `eclectus run chain-summary --input notes.md` works on a short file."""
    notes = tmp_path / "notes.md"
    notes.write_text(NOTES, encoding="utf-8")
    done = eclectus_run("chain-summary", "--input", str(notes), "--output-tokens", "4")
    assert done.returncode == 0, done.stderr
    assert "note: the document gives 1 chunk(s)" in done.stderr
    assert "model calls:            1" in done.stdout


@pytest.mark.slow
def test_shared_prompt_too_long_for_tiny_is_one_line() -> None:
    done = eclectus_run("shared-prompt", "--param", "system_tokens=16384")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("eclectus run:")]
    assert "system_tokens=16384" in line and "pass --param system_tokens=" in line


@pytest.mark.slow
@pytest.mark.parametrize("value", ["0", "-1"])
def test_cli_refuses_num_chunks_below_one(value: str) -> None:
    done = eclectus_run("map-reduce", "--num-chunks", value)
    assert done.returncode == 2 and "num_chunks must be >= 1" in done.stderr


@pytest.mark.slow
def test_compiled_progress_counts_the_server_calls(
    embedded: Embedded, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compiled run's calls never reach a client callback; the progress line still ends
    at all calls done, read from the server."""
    params = MapReduceParams(chunk_tokens=256, num_chunks=2, map_tokens=4, reduce_tokens=4)
    result = run_recipe("map-reduce", params, embedded.target("eclectus"), progress=True)
    assert result.num_calls == 3
    assert capsys.readouterr().err.splitlines()[-1] == "map-reduce: calls 3/3"
