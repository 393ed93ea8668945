"""The CI smoke test of ``eclectus eval``: tiny runs against the ``self`` baseline complete and
write a well-formed report (ratios are reported, not asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eclectus.cli import main

pytestmark = pytest.mark.timeout(300)


def _eval(out: Path, *flags: str) -> dict[str, Any]:
    assert (
        main(["eval", *flags, "--quick", "--reps", "1", "--bound-reps", "1", "--out", str(out)])
        == 0
    )
    return json.loads((out / "results.json").read_text())


def test_eval_map_reduce_writes_results_report_and_plots(tmp_path: Path) -> None:
    """A sync graph: both systems run (warm-up marked -1), counted, bounded, reported."""
    results = _eval(tmp_path, "map-reduce", "--set", "num_chunks=2", "--sweep", "map_tokens=4")
    runs = results["runs"]
    assert {r["system"] for r in runs} == {"eclectus", "self"}
    assert {r["rep"] for r in runs} == {-1, 0}
    assert all(r["num_calls"] == 3 and r["wall_s"] > 0 and r["prompt_tokens"] > 0 for r in runs)
    # one engine span per call, from the server's tracer (`eclectus serve` + --trace-file)
    assert all(r["span_source"] == "engine" and len(r["spans"]) == 3 for r in runs)
    assert [b["engine"] for b in results["bounds"]] == ["eclectus"]
    assert {s["system"] for s in results["summary"]} == {"eclectus", "self"}
    report = (tmp_path / "report.md").read_text()
    assert "| map_tokens=4 | eclectus |" in report and "| map_tokens=4 | self |" in report
    for name in ("map-reduce-map_tokens.png", "map-reduce-timeline.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


def test_eval_shared_prompt_runs_an_async_app_repeatedly(tmp_path: Path) -> None:
    """An asyncio app run twice per system (warm-up, then measured) through the stock async
    client; the metric is the chat latency, with a delay proxy on every connection."""
    results = _eval(
        tmp_path,
        "shared-prompt",
        "--set",
        "requests=2",
        "--sweep",
        "rate=20",
        "--rtt-ms",
        "20",
        "--no-plots",
    )
    measured = [r for r in results["runs"] if r["rep"] == 0]
    assert len(measured) == 2 and all(r["metric"] >= 0.02 for r in measured)
    assert results["config"]["rtt_ms"] == 20
    assert "chat p50 latency" in (tmp_path / "report.md").read_text()


def test_the_swap_variant_runs_each_call_as_its_own_round_trip(tmp_path: Path) -> None:
    """``--variants compiled,swap``: beside ``eclectus`` (the chain compiled into one graph)
    ``eclectus/swap`` runs the same app with the import swap alone, every call a round trip,
    on the same server; both answer what the stock client gets from the same engine."""
    results = _eval(
        tmp_path,
        "map-reduce",
        "--set",
        "num_chunks=2",
        "--sweep",
        "map_tokens=4",
        "--variants",
        "compiled,swap",
        "--no-plots",
    )
    measured = {r["system"]: r for r in results["runs"] if r["rep"] == 0}
    assert set(measured) == {"eclectus", "eclectus/swap", "self"}
    assert measured["eclectus"]["round_trips"] == 1
    assert measured["eclectus/swap"]["round_trips"] == measured["eclectus/swap"]["num_calls"]
    assert measured["eclectus/swap"]["output"] == measured["eclectus"]["output"]
    assert measured["eclectus/swap"]["output"] == measured["self"]["output"]
    described = {s["name"]: s["description"] for s in results["config"]["systems"]}
    assert "import swap alone" in described["eclectus/swap"]
    assert [b["engine"] for b in results["bounds"]] == ["eclectus"]  # one engine, one bound
    # three runs of one document on one engine: its prefix cache is emptied before each
    # (POST /reset_prefix_cache), so no run is served from an earlier run's cache
    for rep in (-1, 0):
        counts = {
            (r["prompt_tokens"], r["cached_tokens"]) for r in results["runs"] if r["rep"] == rep
        }
        assert len(counts) == 1


def test_the_reference_defaults_to_the_first_system(tmp_path: Path) -> None:
    """Without --reference the ratios are against the first system: eclectus, or
    eclectus/swap when only the swap variant runs; a name not in the run is refused."""
    from eclectus.evals.budget import Budget
    from eclectus.evals.cli import reference
    from eclectus.evals.launch import LaunchPlan

    plan = LaunchPlan(tmp_path, "tiny", Budget(), ("self",), tmp_path)
    assert reference(None, plan) == "eclectus" and reference("self", plan) == "self"
    swap = LaunchPlan(tmp_path, "tiny", Budget(), ("self",), tmp_path, variants=("swap",))
    assert reference(None, swap) == "eclectus/swap"
    with pytest.raises(ValueError, match="choose from eclectus/swap, self"):
        reference("eclectus", swap)


def test_an_unknown_variant_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "map-reduce", "--variants", "eager", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith("choose from swap, compiled, each once")


def test_a_failing_system_is_reported_and_the_rest_still_measured(tmp_path: Path) -> None:
    """A baseline that cannot be reached fails each of its runs; the eval goes on, writes the
    report with those failures listed, and exits 1."""
    flags = ["map-reduce", "--set", "num_chunks=2", "--sweep", "map_tokens=4", "--no-plots"]
    dead = "openai=http://127.0.0.1:9/v1"  # the discard port: nothing listens
    args = [*flags, "--baseline", "self", "--baseline", dead, "--quick", "--reps", "1"]
    assert main(["eval", *args, "--bound-reps", "1", "--out", str(tmp_path)]) == 1
    results = json.loads((tmp_path / "results.json").read_text())
    assert {r["system"] for r in results["runs"]} == {"eclectus", "self"}
    failed = results["failures"]
    assert {f["rep"] for f in failed if f["system"] != "eclectus"} >= {-1, 0}
    assert all("Error" in f["error"] for f in failed)
    report = (tmp_path / "report.md").read_text()
    assert "## Failed runs" in report and "| map_tokens=4 | self |" in report


def test_an_rtt_sweep_reuses_the_servers_and_counts_round_trips(tmp_path: Path) -> None:
    """A LangGraph app at two round trips on the same servers: the compiled graph sends
    O(1) frames, the stock client one request per call; the delay shows in the times."""
    results = _eval(
        tmp_path,
        "plan-execute",
        "--set",
        "steps=2",
        "--sweep",
        "rtt_ms=0,150",
        "--reference",
        "self",
        "--no-plots",
    )
    measured = {(r["value"], r["system"]): r for r in results["runs"] if r["rep"] == 0}
    assert set(measured) == {(v, s) for v in (0.0, 150.0) for s in ("eclectus", "self")}
    for rtt in (0.0, 150.0):
        assert measured[rtt, "eclectus"]["round_trips"] == 2  # the router's cut, then the rest
        assert measured[rtt, "self"]["round_trips"] == measured[rtt, "self"]["num_calls"] == 4
    # plan, the steps in parallel, the answer: three dependent requests, each 150 ms more
    assert measured[150.0, "self"]["wall_s"] >= 0.45
    # the bound runs without the delay: measured once, reported at both points
    first, second = results["bounds"]
    assert (first["value"], second["value"]) == (0.0, 150.0)
    assert first["samples"] == second["samples"]
    assert results["config"]["reference"] == "self"
    report = (tmp_path / "report.md").read_text()
    assert "| rtt_ms=150.0 | self |" in report and "round trips" in report


def test_a_reference_that_is_not_a_system_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--reference names a system of the run, or the command exits 2 before starting any."""
    assert main(["eval", "map-reduce", "--reference", "vllm", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--reference vllm: not a system of this run; choose from eclectus, self" in err
    assert not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("value", ["0", "often"])
def test_a_bad_front_stream_interval_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    """--front-stream-interval takes an integer >= 1; anything else exits 2 at once."""
    argv = ["eval", "map-reduce", "--front-stream-interval", value, "--out", str(tmp_path)]
    assert main(argv) == 2
    assert f"--front-stream-interval {value}: an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_a_bad_front_max_background_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--front-max-background takes an integer >= 0 or none; anything else exits 2 at once."""
    argv = ["eval", "map-reduce", "--front-max-background", "some", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "--front-max-background some: an integer >= 0, or none" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()
