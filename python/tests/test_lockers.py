"""The polling and the queued locker side by side; permits, the read-write lock, several keys
at once; errors as exceptions."""

import threading

import pytest

import waitlock


def test_polling_and_queued_lockers_side_by_side(redis):
    lockers = [waitlock.Locker(redis.url), waitlock.PubSubLocker(redis.url), waitlock.QueuedLocker(redis.url)]
    assert waitlock.QueuedLocker is waitlock.PubSubLocker
    counts = {}
    inside = {}
    overlap = []

    def work(locker, key, n):
        for _ in range(n):
            with locker.lock(key, ttl=10, wait=60) as held:
                inside[key] = inside.get(key, 0) + 1
                if inside[key] > 1:
                    overlap.append(key)
                counts[key] = counts.get(key, 0) + 1
                assert held.fence > 0
                inside[key] -= 1

    threads = [
        threading.Thread(target=work, args=(lockers[i % 3], key, 20))
        for key in ("polled", "queued", "mixed")
        for i in range(4)
        if key != "polled" or i % 3 == 0
    ]
    # "polled": polling only; "queued": both queued lockers; "mixed": all three (a polling
    # caller waits behind the queue, never jumps it).
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not overlap
    assert counts["queued"] == 80 and counts["mixed"] == 80 and counts["polled"] == 40


def test_permits_and_the_read_write_lock(redis):
    locker = waitlock.PubSubLocker(redis.url)
    sem = locker.semaphore(2)
    a = sem.acquire("pool")
    b = sem.acquire("pool")
    with pytest.raises(waitlock.Locked):
        sem.acquire("pool", wait=0)
    a.release()
    with sem.lock("pool", wait=5) as c:
        assert c.fence > b.fence
    b.release()
    with pytest.raises(waitlock.InvalidArgument):
        sem.acquire("pool", weight=3)

    rw = locker.rw_lock()
    with rw.read("cfg") as r1, rw.read("cfg") as r2:
        assert r1.fence != r2.fence
        with pytest.raises(waitlock.Locked):
            with rw.write("cfg", wait=0):
                pass
    with rw.write("cfg", wait=5):
        with pytest.raises(waitlock.Locked):
            with rw.read("cfg", wait=0):
                pass


def test_several_keys_at_once(redis):
    locker = waitlock.PubSubLocker(redis.url)
    held = locker.acquire("b", ttl=30)
    with pytest.raises(waitlock.Locked):
        with locker.lock_many(["a", "b", "c"], wait=0):
            pass
    assert locker.status("a")["held"] is False, "all or none"
    held.release()
    with locker.lock_many(["a", "b", "c"], wait=5) as s:
        assert sorted(s.keys) == ["a", "b", "c"]
        assert len(s.fences) == 3


def test_errors_are_exceptions_with_their_fields(redis):
    locker = waitlock.PubSubLocker(redis.url)
    held = locker.acquire("e", ttl=30)
    with pytest.raises(waitlock.WaitTimeout) as e:
        locker.acquire("e", wait=0.05)
    assert e.value.key == "e" and e.value.attempts >= 1 and e.value.waited >= 0.05
    assert isinstance(e.value, waitlock.WaitlockError)
    with pytest.raises(waitlock.InvalidArgument):
        locker.acquire("e", ttl=-1)
    with pytest.raises(waitlock.InvalidArgument) as bad:
        locker.acquire("", ttl=5)
    assert bad.value.key == ""
    held.release()
    with pytest.raises(waitlock.NotHeld):
        held.release()
    with pytest.raises(waitlock.ConnectError):
        waitlock.Locker("redis://127.0.0.1:1")


def test_a_blocking_wait_interrupted_by_ctrl_c_leaves_its_queue_at_once(redis):
    """Ctrl-C (SIGINT) ends a blocking acquire with KeyboardInterrupt; the wait it dropped
    cleans up as a cancelled wait does (its waiter leaves the queue), which needs the runtime:
    dropped on the calling thread, the clean-up found no runtime and the entry stayed queued
    (the lock would then be granted to a process that no longer waits for it)."""
    import os
    import signal

    from conftest import until

    locker = waitlock.PubSubLocker(redis.url)
    other = waitlock.PubSubLocker(redis.url)
    held = other.acquire("ctrl-c", ttl=30)

    def interrupt():
        until(lambda: other.status("ctrl-c")["waiters"] == 1, "the waiter queued", limit=30)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        locker.acquire("ctrl-c", ttl=5, wait=30)
    until(lambda: other.status("ctrl-c")["waiters"] == 0, "the interrupted waiter gone", limit=5)
    held.release()
