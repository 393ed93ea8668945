"""The function-style recipes against their LCEL forms, on one server, rounds alternating.

    python -m eclectus.evals.forms_bench [--rounds 5] [--quick] [--url ws://host:port]

Each recipe that has a function form (recipes/functions.py) runs in Eclectus mode at the
eval's base sizes (``eclectus eval``'s full workloads, ``--quick`` its quick ones): per
round the LCEL form, then the function form, then the next recipe. Both make the same
calls with the same prompts (their outputs are compared); what differs is how the client
gets there: lowering an LCEL chain, or evaluating the Python. Prints each form's median,
min and max seconds and the function form's median over the LCEL form's.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from eclectus.evals.workloads import FUNCTION_FORMS, full_workloads, quick_workloads
from eclectus.recipes.embedded import embedded_server
from eclectus.recipes.runner import run_recipe
from eclectus.recipes.target import Target


def measure(target: Target, rounds: int, quick: bool) -> dict[str, dict[str, list[float]]]:
    """Seconds per run, by recipe then form ("lcel", "fn"); a warm-up run of each first."""
    table = quick_workloads() if quick else full_workloads()
    times: dict[str, dict[str, list[float]]] = {n: {"lcel": [], "fn": []} for n in FUNCTION_FORMS}
    for round_ in range(rounds + 1):
        for name in FUNCTION_FORMS:
            params = table[name].base
            outputs: dict[str, Any] = {}
            for form, recipe in (("lcel", name), ("fn", f"{name}-fn")):
                result = run_recipe(recipe, params, target)
                outputs[form] = result.output
                if round_:  # round 0 warms sessions and caches up alike
                    times[name][form].append(result.wall_s)
            if outputs["lcel"] != outputs["fn"]:
                raise SystemExit(f"{name}: the function form's output differs from the LCEL form's")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the eval's quick sizes")
    parser.add_argument("--url", default=None, help="a running Eclectus server's ws:// URL")
    args = parser.parse_args()
    if args.url:
        times = measure(Target("eclectus", args.url), args.rounds, args.quick)
    else:
        with embedded_server("tiny") as server:
            times = measure(server.target("eclectus"), args.rounds, args.quick)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for name, forms in times.items():
        lcel, fn = forms["lcel"], forms["fn"]
        ratio = statistics.median(fn) / statistics.median(lcel)
        print(
            f"{name:14s} lcel median {statistics.median(lcel):.3f} s "
            f"({min(lcel):.3f}-{max(lcel):.3f})  fn median {statistics.median(fn):.3f} s "
            f"({min(fn):.3f}-{max(fn):.3f})  fn / lcel {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
