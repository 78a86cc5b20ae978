"""A prefork worker pool: the package imported (and a locker made) in the parent, the pool's
workers forked after; each worker makes its own locker and they contend on one key."""

import multiprocessing
import os

import pytest

import waitlock

_locker = None


def _init(url: str) -> None:
    global _locker
    _locker = waitlock.PubSubLocker(url)


def _work(args):
    """`n` non-atomic increments of a counter file under the lock; each hold's times."""
    path, n = args
    spans = []
    for _ in range(n):
        with _locker.lock("counter", ttl=10, wait=60) as held:
            start = _monotonic_ns()
            with open(path) as f:
                value = int(f.read())
            with open(path, "w") as f:
                f.write(str(value + 1))
            spans.append((start, _monotonic_ns(), held.fence))
    return spans


def _monotonic_ns() -> int:
    import time

    return time.monotonic_ns()


def test_a_prefork_pool_contends_on_one_key(redis, tmp_path):
    # The parent uses the package first: its runtime and connections must not leak into the
    # children.
    parent = waitlock.PubSubLocker(redis.url)
    with parent.lock("counter", ttl=5):
        pass
    path = tmp_path / "counter"
    path.write_text("0")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4, initializer=_init, initargs=(redis.url,)) as pool:
        results = pool.map(_work, [(str(path), 25)] * 8)
    spans = sorted(s for r in results for s in r)
    assert int(path.read_text()) == 200
    for (s0, e0, f0), (s1, e1, f1) in zip(spans, spans[1:]):
        assert e0 <= s1, "two holders at once"
        assert f1 > f0, "fences grow with each acquisition"


def _use_parents_locker(locker, q) -> None:
    try:
        locker.acquire("k", wait=0)
        q.put("no error")
    except waitlock.ForkError as e:
        q.put(f"ForkError: {e}")
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(f"{type(e).__name__}: {e}")


def test_a_locker_made_before_fork_refuses_in_the_child(redis):
    locker = waitlock.PubSubLocker(redis.url)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_use_parents_locker, args=(locker, q))
    p.start()
    said = q.get(timeout=60)
    p.join(60)
    assert said.startswith("ForkError:"), said
    assert "after the fork" in said and str(os.getpid()) in said
    # The parent's locker still works.
    with locker.lock("k", ttl=5) as held:
        assert held.fence > 0
