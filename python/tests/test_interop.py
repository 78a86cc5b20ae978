"""A Python worker and a Rust worker (the `waitlock` command) on one key wait in one FIFO
queue: the lock goes to them in the order they queued, whatever their language."""

import os
import subprocess
import threading

import waitlock
from conftest import until


def test_python_and_rust_workers_share_one_fifo_queue(redis, waitlock_cli, tmp_path):
    out = tmp_path / "order"
    out.write_text("")
    holder = waitlock.PubSubLocker(redis.url)
    python_worker = waitlock.PubSubLocker(redis.url)
    env = dict(os.environ, REDIS_URL=redis.url)

    def rust(name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [waitlock_cli, "-q", "run", "--wait", "60s", "fifo", "--",
             "sh", "-c", f'echo "{name} $WAITLOCK_FENCE" >> {out}'],
            env=env,
        )

    def python(name: str) -> None:
        with python_worker.lock("fifo", ttl=10, wait=60) as held:
            with open(out, "a") as f:
                f.write(f"{name} {held.fence}\n")

    held = holder.acquire("fifo", ttl=30)
    # Queue: Rust, Python, Rust, Python; each waits until the one before it is queued.
    first = rust("rust-1")
    until(lambda: holder.status("fifo")["waiters"] == 1, "the first Rust worker to queue")
    t1 = threading.Thread(target=python, args=("python-1",))
    t1.start()
    until(lambda: holder.status("fifo")["waiters"] == 2, "the first Python worker to queue")
    second = rust("rust-2")
    until(lambda: holder.status("fifo")["waiters"] == 3, "the second Rust worker to queue")
    t2 = threading.Thread(target=python, args=("python-2",))
    t2.start()
    until(lambda: holder.status("fifo")["waiters"] == 4, "the second Python worker to queue")

    held.release()
    assert first.wait(60) == 0 and second.wait(60) == 0
    t1.join(60)
    t2.join(60)
    lines = out.read_text().split()
    names, fences = lines[0::2], [int(f) for f in lines[1::2]]
    assert names == ["rust-1", "python-1", "rust-2", "python-2"], lines
    assert fences == sorted(fences) and len(set(fences)) == 4, fences
    assert all(f > held.fence for f in fences)
