"""An eval's server process starts on a fresh port when the one it was given has been taken
in the meantime (a server that loads for minutes can lose its port to another process)."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from eclectus.evals.budget import Budget
from eclectus.evals.servers import HOST, ServerProcess, http_get


@dataclass
class StaticServer(ServerProcess):
    """Python's own HTTP server: binds its port or exits with "Address already in use"."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "http.server", str(self.port), "--bind", HOST]

    def ready(self) -> bool:
        try:
            http_get(f"http://{HOST}:{self.port}/", timeout=2)
            return True
        except OSError:
            return False


def test_a_taken_port_is_replaced_by_a_fresh_one(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = StaticServer("static", tmp_path, Budget(), tmp_path / "server.log", port=port)
        server.start()
        try:
            assert server.port != port
            assert "Directory listing" in http_get(f"http://{HOST}:{server.port}/")
        finally:
            server.stop()
