"""asyncio: a task cancelled at every await leaves nothing behind; a lost lock is seen by its
holder at once, and `run` cancels the section."""

import asyncio

import pytest

import waitlock
from conftest import until


def test_a_task_cancelled_at_every_await_leaves_nothing_behind(redis):
    locker = waitlock.PubSubLocker(redis.url)
    other = waitlock.PubSubLocker(redis.url)

    async def section():
        async with locker.lock("k", ttl=10, wait=30) as held:
            await asyncio.sleep(0.001)
            await held.aextend(10)
            await asyncio.sleep(0.001)

    async def main():
        # While another process holds the key: cancelled before, while and after queueing.
        held = await other.aacquire("k", ttl=30)
        for delay in [0, 0, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05]:
            task = asyncio.ensure_future(section())
            await asyncio.sleep(delay)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await held.arelease()
        # While the key is free and handed over: cancelled at every point of a section
        # (acquire, the body, extend, the release in `__aexit__`).
        for i in range(60):
            tasks = [asyncio.ensure_future(section()) for _ in range(3)]
            await asyncio.sleep(0.0005 * (i % 12))
            tasks[i % 3].cancel()
            for t in tasks:
                try:
                    await t
                except asyncio.CancelledError:
                    pass

    asyncio.run(main())
    for l in (locker, other):
        l.idle()
    until(lambda: locker.status("k") == {"held": False, "fence": locker.status("k")["fence"], "waiters": 0},
          "the key free with nobody queued")
    with locker.lock("k", ttl=5, wait=0):
        pass


def test_a_lost_lock_is_seen_by_its_holder(redis):
    # (The refresher finds the loss at its next extension, within 0.8 x the TTL: a short TTL
    # keeps the test short, never a sleep.)
    locker = waitlock.PubSubLocker(redis.url)
    held = locker.acquire("gone", ttl=2)
    assert held.lost is None
    assert held.wait_lost(timeout=0.05) is None
    redis.command("DEL", "{waitlock:gone}")
    assert held.wait_lost(timeout=30) == "token_gone"
    assert held.lost == "token_gone"
    with pytest.raises(waitlock.NotHeld) as e:
        held.release()
    assert e.value.key == "gone"
    assert held.lost == "token_gone", "the reason outlives the release"


def test_run_cancels_the_section_when_the_lock_is_lost(redis):
    locker = waitlock.PubSubLocker(redis.url)
    cancelled = []

    async def section(held):
        assert held.key == "run"
        redis.command("DEL", "{waitlock:run}")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        with pytest.raises(waitlock.Expired) as e:
            await locker.run("run", section, ttl=2)
        assert e.value.reason == "token_gone"
        assert cancelled == [True]
        # A section that ends first returns its value, and the lock is released.
        assert await locker.run("run", lambda h: asyncio.sleep(0, result=h.fence)) > 0
        assert locker.status("run")["held"] is False
        # `alost` wakes at the loss, with its reason.
        held = await locker.aacquire("run2", ttl=2)
        waiter = asyncio.ensure_future(held.alost())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        redis.command("DEL", "{waitlock:run2}")
        assert await asyncio.wait_for(waiter, 30) == "token_gone"

    asyncio.run(main())


def test_a_result_that_came_before_a_cancelled_task_resumed_is_let_go(redis):
    """The race the loop above meets by chance, made certain: the lock is ours, its callback
    has run, and the task is cancelled before it resumes. The lock must go at once, not when
    the cancelled task's traceback is collected."""
    from waitlock import _started

    locker = waitlock.PubSubLocker(redis.url)
    native = locker._n.acquire("race", ttl=30, wait=0)

    class Pending:
        def cancel(self):
            pass

    async def main():
        task = None

        def start(loop, done):
            loop.call_soon(done, native, None)  # the result arrives...
            loop.call_soon(lambda: task.cancel())  # ...and the cancellation before the task resumes
            return Pending()

        task = asyncio.ensure_future(_started(start))
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    until(lambda: not locker.status("race")["held"], "the lock let go", limit=30)
    assert native.lost is None or native.lost == "lost"


def test_a_release_cancelled_before_it_ran_still_lets_the_lock_go(redis):
    """The other race of that loop, made all but certain: `arelease` cancelled at once, its
    native release aborted before the runtime first ran it, while the `Held` is still
    referenced (a cancelled task's traceback keeps it). The lock must go all the same, not stay
    held, and refreshed, for as long as the `Held` lives (its waiters waited out their
    deadlines: the loop above failed so, 1 run in 20 on a busy machine)."""
    locker = waitlock.PubSubLocker(redis.url)
    other = waitlock.PubSubLocker(redis.url)

    async def main():
        loop = asyncio.get_running_loop()
        kept = []
        for i in range(5):
            held = await locker.aacquire(f"cut{i}", ttl=30)
            kept.append(held)
            pending = held._h.release_start(loop, lambda value, error: None)
            pending.cancel()
            got = await other.aacquire(f"cut{i}", ttl=5, wait=10)
            await got.arelease()

    asyncio.run(main())


def test_a_lock_lost_inside_a_with_block_raises_expired_at_its_end(redis):
    locker = waitlock.PubSubLocker(redis.url)
    with pytest.raises(waitlock.Expired) as e:
        with locker.lock("body", ttl=2) as held:
            redis.command("DEL", "{waitlock:body}")
            held.wait_lost(timeout=30)
    assert e.value.key == "body" and e.value.reason == "token_gone"
    # The body's own exception is never masked by the release's.
    with pytest.raises(ZeroDivisionError):
        with locker.lock("body", ttl=2) as held:
            redis.command("DEL", "{waitlock:body}")
            held.wait_lost(timeout=30)
            1 / 0

    async def main():
        with pytest.raises(waitlock.Expired):
            async with locker.lock("body", ttl=2) as held:
                redis.command("DEL", "{waitlock:body}")
                await held.alost()

    asyncio.run(main())
