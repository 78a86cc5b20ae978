"""Fixtures: a private redis-server per test module (never the shared one), killed by its pid;
the `waitlock` command (the Rust library's CLI) for tests that mix Python and Rust workers."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail(
                "redis-server not found: the tests start their own. Install it "
                "(Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)",
                pytrace=False,
            )
        self.dir = tempfile.mkdtemp(prefix="waitlock-py-")
        for _ in range(10):
            self.port = _free_port()
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no", "--dir", self.dir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            if self._wait_ready():
                self.url = f"redis://127.0.0.1:{self.port}"
                return
            self.proc.kill()
            self.proc.wait()
        pytest.fail("redis-server did not start on a free port in 10 tries", pytrace=False)

    def _wait_ready(self) -> bool:
        # The event: the server answers PING (or the process ended: the port was taken).
        while self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                time.sleep(0.01)
        return False

    def command(self, *words: str) -> bytes:
        """One command, sent raw (RESP), its first reply line."""
        out = b"*%d\r\n" % len(words) + b"".join(
            b"$%d\r\n%s\r\n" % (len(w.encode()), w.encode()) for w in words
        )
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(out)
            return s.recv(4096).split(b"\r\n")[0]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def redis():
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def waitlock_cli() -> str:
    """The `waitlock` command built from this repository (a Rust worker), with the features
    the suite builds it with (`cargo test --all-features`): nothing is built again after it."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo not found: these tests build the waitlock command (install Rust: https://rustup.rs)", pytrace=False)
    subprocess.run(
        [cargo, "build", "--locked", "-q", "--all-features", "--bin", "waitlock"],
        cwd=REPO, check=True,
    )
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "debug", "waitlock")


def until(cond, what: str, limit: float = 60.0):
    """Waits for `cond()` to hold (the event), failing after `limit` seconds with `what`."""
    deadline = time.monotonic() + limit
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)
