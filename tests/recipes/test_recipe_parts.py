"""Fast tests of the recipes' pure parts: samples, chunking, planning, flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from eclectus.recipes.cli import add_arguments, build_params, remote_target
from eclectus.recipes.map_reduce import MapReduceParams, collapse_levels, planned_calls
from eclectus.recipes.multi_agent import file_names
from eclectus.recipes.shared_prompt import (
    SharedPromptParams,
    arrivals,
    handbook_and_rest,
    job_reader,
    job_starts,
    plan,
    questions,
    split_document,
    split_jobs,
)
from eclectus.recipes.text import approx_tokens, load_sample, sample_names, split_chunks


def test_samples_are_long_enough() -> None:
    """At least three bundled samples, each >= 17 KB and >= 16 chunks of 1024 tokens."""
    names = sample_names()
    assert len(names) >= 3
    for name in names:
        text = load_sample(name)
        assert len(text.encode()) >= 17_000, name
        assert len(split_chunks(text, 1024)) >= 16, name


def test_chunks_fit_and_cover_the_text() -> None:
    """Chunks stay within the size, end at word boundaries and keep every word in order."""
    text = load_sample(sample_names()[0])
    chunks = split_chunks(text, 256)
    assert all(approx_tokens(c) <= 256 for c in chunks)
    assert " ".join(chunks).split() == text.split()
    assert split_chunks(text, 256, 3) == chunks[:3]
    with pytest.raises(ValueError, match="not 10000"):
        split_chunks(text, 256, 10_000)


def test_collapse_plan() -> None:
    """Levels shrink by the group size until one prompt holds the rest."""
    assert collapse_levels(4, 4) == []
    assert collapse_levels(9, 2) == [5, 3, 2]
    params = MapReduceParams(map_tokens=50, context_tokens=4096)
    assert planned_calls(params, 16) == (17, 2)


def test_file_names_are_parsed_and_padded() -> None:
    """Named files come first, deduplicated; missing ones are padded."""
    listing = "api.py\nstore.py\n- api.py\nREADME.md extra"
    assert file_names(listing, 4) == ["api.py", "store.py", "README.md", "module_0.py"]
    assert file_names("no files here", 2) == ["module_0.py", "module_1.py"]


def test_shared_prompt_workload_is_seeded() -> None:
    """Questions and Poisson arrivals repeat for a seed and increase in time."""
    params = SharedPromptParams(requests=5, users=2, seed=3, rate=2.0)
    text = load_sample(sample_names()[0])
    assert questions(params, text) == questions(params, text)
    times = arrivals(params)
    assert times == arrivals(params) and times == sorted(times) and times[0] == 0.0


def test_background_jobs_spread_over_the_chats_with_their_own_chunks() -> None:
    """Jobs start evenly over the chats' expected arrival window; each reads chunks no other
    job reads (wrapped ones are prefixed with the job's number); one job is the old job."""
    text = load_sample(sample_names()[0])
    background = MapReduceParams(chunk_tokens=1024, num_chunks=8, map_tokens=8, width=8)
    params = SharedPromptParams(
        requests=16, rate=2.0, system_tokens=1024, background=background, background_jobs=8
    )
    assert job_starts(params) == [float(k) for k in range(8)]
    handbook, jobs = split_jobs(params, text)
    assert len(jobs) == 8 and all(len(chunks) == 8 for chunks in jobs)
    every = [c for chunks in jobs for c in chunks]
    assert len(set(every)) == len(every)  # no two map prompts alike
    assert split_document(params, text) == (handbook, jobs[0])
    single = SharedPromptParams(requests=16, rate=2.0, system_tokens=1024, background=background)
    assert split_jobs(single, text)[1] == [jobs[0]] and job_starts(single) == [0.0]
    assert plan(params, text) == 16 + 8 * planned_calls(background, 8)[0]
    with pytest.raises(ValueError, match="background_jobs"):
        SharedPromptParams(background_jobs=0)


@pytest.mark.parametrize("layout", ["one space", "lines and paragraphs"])
def test_the_handbook_is_not_read_again_by_the_analytics_job(layout: str) -> None:
    """The rest starts where the handbook ends, however the document's whitespace runs (line
    breaks, paragraphs, runs of spaces): the analytics job never re-reads the handbook."""
    words = " ".join(load_sample(sample_names()[0]).split()).split(" ")
    text = " ".join(words)
    if layout != "one space":  # a newline every 9th word, a blank line every 40th, two spaces
        text = "".join(
            word + ("\n\n" if i % 40 == 39 else "\n" if i % 9 == 8 else "  ")
            for i, word in enumerate(words)
        )
    handbook, rest = handbook_and_rest(SharedPromptParams(system_tokens=256), text)
    assert 0 < len(rest) < len(text) - len(handbook) // 2
    assert " ".join(f"{handbook} {rest}".split()) == " ".join(text.split())  # nothing lost


def test_closed_loop_jobs_read_their_own_chunks_however_many_run() -> None:
    """A closed loop's job k reads what the open loop's job k reads, for any k; its plan
    counts the first wave of jobs; its concurrency is at least 1."""
    text = load_sample(sample_names()[0])
    background = MapReduceParams(chunk_tokens=1024, num_chunks=8, map_tokens=8, width=8)
    spread = SharedPromptParams(requests=16, system_tokens=1024, background=background)
    closed = dataclasses.replace(spread, background_concurrency=2)
    _, read = job_reader(closed, text)
    assert read is not None
    opened = split_jobs(dataclasses.replace(spread, background_jobs=8), text)[1]
    assert [read(k) for k in range(8)] == opened
    every = [c for k in range(40) for c in read(k)]
    assert len(set(every)) == len(every)
    assert plan(closed, text) == 16 + 2 * planned_calls(background, 8)[0]
    assert job_reader(dataclasses.replace(closed, background=None), text)[1] is None
    with pytest.raises(ValueError, match="background_concurrency"):
        SharedPromptParams(background_concurrency=0)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_build_params_and_targets() -> None:
    """Common flags, --output-tokens and --param land on the recipe's params; URLs pick
    the target (none: embedded)."""
    args = parse(
        "map-reduce", "--num-chunks", "4", "--output-tokens", "9", "--param", "context_tokens=512"
    )
    assert build_params(args) == MapReduceParams(num_chunks=4, map_tokens=9, context_tokens=512)
    assert remote_target(args) is None
    with pytest.raises(ValueError, match="fields are"):
        build_params(parse("map-reduce", "--param", "nope=1"))
    target = remote_target(parse("chain-summary", "--server", "ws://h:9/"))
    assert target is not None and target.metrics_url == "http://h:9/metrics"
    foreign = remote_target(
        parse(
            "chain-summary", "--backend", "openai", "--base-url", "http://h:8000/v1", "--model", "m"
        )
    )
    assert foreign is not None and foreign.metrics_url is None and foreign.model == "m"
