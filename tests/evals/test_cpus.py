"""``--cpu-layout``: the model-running processes on cores of their own, the rest elsewhere
(evals/cpus.py), on real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from eclectus.evals.cpus import SHARED, CpuLayout, children, descendants, pin_process
from eclectus.evals.servers import HOST, ServerProcess, http_get

CORES = frozenset(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="a layout apart needs 2 cores")

# a server whose "engine" is a child process with a second thread, as vLLM's EngineCore
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    engine = subprocess.Popen([sys.executable, "-c",
        "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
        "time.sleep(60)"])
    address = ("127.0.0.1", int(sys.argv[1]))
    http.server.HTTPServer(address, http.server.SimpleHTTPRequestHandler).serve_forever()
    """
)


@dataclass
class ServerWithEngine(ServerProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", SERVER, str(self.port)]

    def ready(self) -> bool:
        try:
            http_get(f"http://{HOST}:{self.port}/", timeout=2)
            engines = self.engine_pids()  # up, with its second thread
            return bool(engines) and len(list(Path(f"/proc/{engines[0]}/task").iterdir())) == 2
        except OSError:
            return False


def affinities(pid: int) -> set[frozenset[int]]:
    """The affinity of each thread of ``pid``."""
    return {
        frozenset(os.sched_getaffinity(int(task.name)))
        for task in Path(f"/proc/{pid}/task").iterdir()
    }


def test_layouts_parse_and_bad_ones_are_named() -> None:
    cores = frozenset({0, 1, 2, 3})
    assert CpuLayout.parse("shared", cores) == SHARED and not SHARED.pinned
    apart = CpuLayout.parse("apart", cores)
    assert (apart.engine_cpus, apart.other_cpus) == ({3}, {0, 1, 2})
    given = CpuLayout.parse("2-3/0,1", cores)
    assert (given.engine_cpus, given.other_cpus) == ({2, 3}, {0, 1})
    assert "engines on cores 2,3, the rest on 0,1" in given.describe()
    for text, words in [
        ("apart", "needs 2 cores"),
        ("0/0", "share a core"),
        ("1/x", "'x' is not a list of cores"),
        ("sideways", "choose shared, apart"),
        ("5/0", "no core [5]"),
    ]:
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            CpuLayout.parse(text, frozenset({0}) if text == "apart" else cores)


def test_descendants_are_children_then_grandchildren() -> None:
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):
            below = descendants(parent.pid)
            if below:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(below) == 1 and children(parent.pid) == below
        mine = descendants(os.getpid())
        assert parent.pid in children(os.getpid())
        assert mine.index(parent.pid) < mine.index(below[0])
    finally:
        parent.kill()
        parent.wait()


@needs_two_cores
def test_pin_process_moves_every_thread(tmp_path: Path) -> None:
    code = (
        "import threading, time; "
        "threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        while len(list(Path(f"/proc/{proc.pid}/task").iterdir())) < 2:
            subprocess.run(["sleep", "0.02"], check=True)
        core = frozenset({max(CORES)})
        pin_process(proc.pid, core)
        assert affinities(proc.pid) == {core}
    finally:
        proc.kill()
        proc.wait()


@needs_two_cores
def test_a_server_apart_has_its_engine_on_the_engine_core(tmp_path: Path) -> None:
    """Started from a process pinned to the other cores, the server stays there and its
    engine (every thread of its child) moves to the engine core once it answers."""
    layout = CpuLayout.parse("apart")
    code = textwrap.dedent(
        f"""
        import json, os, sys
        from pathlib import Path
        from eclectus.evals.budget import Budget
        from eclectus.evals.cpus import CpuLayout
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cpus import ServerWithEngine, affinities
        layout = CpuLayout.parse("apart")
        layout.pin_self()
        tmp = Path({str(tmp_path)!r})
        server = ServerWithEngine("s", tmp, Budget(), tmp / "log", cpus=layout)
        server.start()
        try:
            engine = server.engine_pids()
            print(json.dumps({{
                "server": [sorted(a) for a in affinities(server.proc.pid)],
                "engine": [sorted(a) for p in engine for a in affinities(p)],
                "threads": [len(list(Path(f"/proc/{{p}}/task").iterdir())) for p in engine],
                "me": sorted(os.sched_getaffinity(0)),
            }}))
        finally:
            server.stop()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    other, engine = sorted(layout.other_cpus or ()), sorted(layout.engine_cpus or ())
    assert seen["me"] == other and seen["server"] == [other]
    assert seen["engine"] == [engine] and seen["threads"] == [2]  # both of its threads
