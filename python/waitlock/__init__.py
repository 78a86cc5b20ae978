"""waitlock for Python: distributed locks on Redis whose waiters are woken, not left polling.

The same queue as the Rust library (this package *is* the Rust library, built as an extension):
a Python worker and a Rust worker on one key wait in one FIFO queue, with the same fences,
leases and loss detection.

Two kinds of locker, each usable from threads and processes (blocking calls) and from asyncio
(``async`` calls):

- :class:`PubSubLocker` (also :class:`QueuedLocker`): waiters queue in Redis, FIFO across
  processes, and the release hands the lock to the oldest live waiter.
- :class:`Locker`: waiters retry with jittered exponential backoff.

Blocking::

    locker = waitlock.PubSubLocker("redis://127.0.0.1:6379")
    with locker.lock("report", ttl=30, wait=10) as held:
        write(fence=held.fence)

asyncio::

    async with locker.lock("report", ttl=30, wait=10) as held:
        await write(fence=held.fence)

A held lock is refreshed in the background until released; ``held.lost`` says why it was
lost (or None), ``held.wait_lost()`` / ``await held.alost()`` wait for it, and
``await locker.run(key, fn)`` cancels the section's task the moment the lock is lost.

One background runtime per process. After ``fork()`` (a prefork worker pool) the child makes
its own on first use; a locker made before the fork raises :class:`ForkError` in the child:
make lockers in the worker (its initializer), not in the parent.
"""

from __future__ import annotations

import asyncio
import atexit
import os
from typing import Any, Awaitable, Callable, Iterable, Optional, TypeVar

from . import _native
from ._native import (
    ConnectError,
    Expired,
    ForkError,
    InvalidArgument,
    Locked,
    NotHeld,
    RedisError,
    WaitlockError,
    WaitTimeout,
)

# At exit, no callback of an operation still on its way attaches to the interpreter while it
# finalizes (that aborted the process).
atexit.register(_native.shutdown)

__all__ = [
    "Locker",
    "PubSubLocker",
    "QueuedLocker",
    "Semaphore",
    "RwLock",
    "Held",
    "WaitlockError",
    "WaitTimeout",
    "Locked",
    "Expired",
    "NotHeld",
    "ConnectError",
    "InvalidArgument",
    "RedisError",
    "ForkError",
]

T = TypeVar("T")

DEFAULT_URL = "redis://127.0.0.1:6379"


async def _started(start: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs a native operation started with ``start(loop, callback, ...)`` and awaits it.
    Cancelled, it cancels the operation (nothing left behind), and a result that raced the
    cancellation is let go (a held lock released in the background)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def done(value: Any, error: Optional[BaseException]) -> None:
        if fut.cancelled():
            if isinstance(value, _native.Held):
                value.discard()
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    pending = start(loop, done, *args, **kwargs)
    try:
        return await fut
    except asyncio.CancelledError:
        pending.cancel()
        # The result came, but the task was cancelled before it resumed: let it go now (kept,
        # the cancelled task's traceback would hold the lock until it is collected).
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            value = fut.result()
            if isinstance(value, _native.Held):
                value.discard()
        raise


class _Lock:
    """What ``lock()`` returns: a context manager, ``with`` (blocking) or ``async with``.
    Released on exit; a lock lost while the body ran raises Expired there (with its
    ``reason``), unless the body raised."""

    def __init__(self, acquire: Callable[[], Any], aacquire: Callable[[], Awaitable[Any]]):
        self._acquire = acquire
        self._aacquire = aacquire
        self._held: Optional[Held] = None

    def __enter__(self) -> Held:
        self._held = Held(self._acquire())
        return self._held

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        try:
            held.release()
        except NotHeld:
            # Lost while the body ran: its effects may overlap the next holder's. Said unless
            # the body's own exception is on its way (never masked).
            if exc_type is None:
                raise _expired(held) from None
        except WaitlockError:
            # (Redis did not answer: the release goes on in the background.)
            if exc_type is None:
                raise

    async def __aenter__(self) -> Held:
        self._held = Held(await self._aacquire())
        return self._held

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        try:
            await held.arelease()
        except NotHeld:
            if exc_type is None:
                raise _expired(held) from None
        except WaitlockError:
            if exc_type is None:
                raise


def _expired(held: "Held") -> Expired:
    """`Expired` for `held`, lost while its section ran."""
    reason = held.lost or "token_gone"
    e = Expired(f"lock {held.key!r} was lost while held: {reason}")
    e.key, e.reason = held.key, reason
    return e


class Held:
    """A held lock (or permits, or a set of keys), refreshed in the background until released.
    Dropping it releases it in the background."""

    __slots__ = ("_h",)

    def __init__(self, native: Any) -> None:
        self._h = native

    def __repr__(self) -> str:
        return f"<waitlock.Held key={self.key!r} fence={self.fence} lost={self.lost!r}>"

    @property
    def key(self) -> str:
        """The key (a set's first key, in the order taken)."""
        return self._h.key

    @property
    def keys(self) -> list:
        """Every key held, in the order taken."""
        return self._h.keys

    @property
    def fence(self) -> int:
        """This acquisition's fence: above every earlier one's of the key. Hand it to storage
        that refuses stale writers."""
        return self._h.fence

    @property
    def fences(self) -> list:
        """``(key, fence)`` of every key held."""
        return self._h.fences

    @property
    def token(self) -> str:
        """The holder's token."""
        return self._h.token

    @property
    def lost(self) -> Optional[str]:
        """Why the lock was lost (``token_gone``, ``unreachable``, ``ttl_elapsed``,
        ``not_replicated``), or None while it is held."""
        return self._h.lost

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[str]:
        """Blocks until the lock is lost (its reason) or ``timeout`` seconds pass (None)."""
        return self._h.wait_lost(timeout)

    async def alost(self) -> str:
        """Waits until the lock is lost; its reason."""
        return await _started(self._h.wait_lost_start)

    def release(self) -> None:
        """Releases the lock (every key of a set). Raises NotHeld when it no longer held it
        (it was lost: see :attr:`lost`; or it was released already)."""
        self._h.release()

    async def arelease(self) -> None:
        """As :meth:`release`, awaited. Cancelled, the release still completes in the
        background."""
        await _started(self._h.release_start)

    def extend(self, ttl: float) -> None:
        """Extends the lease to ``ttl`` seconds from now."""
        self._h.extend(ttl)

    async def aextend(self, ttl: float) -> None:
        """As :meth:`extend`, awaited."""
        await _started(self._h.extend_start, ttl)


class _Base:
    _queued = False

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        prefix: Optional[str] = None,
        command_timeout: Optional[float] = None,
        label: Optional[str] = None,
    ) -> None:
        """Connects to ``url`` (default ``$REDIS_URL``, else ``redis://127.0.0.1:6379``);
        blocks until connected. ``prefix``: of every Redis name (default ``waitlock:``, as the
        Rust library's); ``command_timeout``: seconds per Redis call (default 3);
        ``label``: this process's name for operators."""
        url = url or os.environ.get("REDIS_URL") or DEFAULT_URL
        self._n = _native.NativeLocker(url, self._queued, prefix, command_timeout, label)

    def _args(self, key: str, ttl: float, wait: float, refresh: bool, **more: Any) -> dict:
        return dict(key=key, ttl=ttl, wait=wait, refresh=refresh, **more)

    def acquire(self, key: str, *, ttl: float = 30.0, wait: float = 10.0, refresh: bool = True) -> Held:
        """Acquires ``key``, waiting up to ``wait`` seconds (0: one attempt, ``Locked`` when
        held); holds it for ``ttl`` seconds, refreshed in the background until released
        (``refresh=False``: it expires after ``ttl``). Raises WaitTimeout, Locked, ..."""
        return Held(self._n.acquire(**self._args(key, ttl, wait, refresh)))

    async def aacquire(self, key: str, *, ttl: float = 30.0, wait: float = 10.0, refresh: bool = True) -> Held:
        """As :meth:`acquire`, awaited. Cancelled, the waiter leaves the queue at once."""
        return Held(await _started(self._n.acquire_start, **self._args(key, ttl, wait, refresh)))

    def lock(self, key: str, *, ttl: float = 30.0, wait: float = 10.0, refresh: bool = True) -> _Lock:
        """``with locker.lock(key) as held:`` or ``async with``: acquired on entry, released
        on exit."""
        args = self._args(key, ttl, wait, refresh)
        return _Lock(
            lambda: self._n.acquire(**args),
            lambda: _started(self._n.acquire_start, **args),
        )

    def lock_many(
        self,
        keys: Iterable[str],
        *,
        ttl: float = 30.0,
        wait: float = 10.0,
        refresh: bool = True,
        ordered: bool = False,
    ) -> _Lock:
        """Several keys at once: all of them, or none. Keys on one Redis node (one server, or
        one hash tag on a Cluster) are taken at once; ``ordered=True`` allows keys over
        several slots, taken in one order."""
        keys = list(keys)
        args = dict(key=keys[0] if keys else "", ttl=ttl, wait=wait, refresh=refresh, keys=keys, ordered=ordered)
        return _Lock(
            lambda: self._n.acquire(**args),
            lambda: _started(self._n.acquire_start, **args),
        )

    async def run(
        self,
        key: str,
        fn: Callable[[Held], Awaitable[T]],
        *,
        ttl: float = 30.0,
        wait: float = 10.0,
    ) -> T:
        """Runs ``await fn(held)`` holding ``key``; the moment the lock is lost, the section's
        task is cancelled and Expired raised (with its ``reason``). Released after."""
        held = await self.aacquire(key, ttl=ttl, wait=wait)
        section = asyncio.ensure_future(fn(held))
        lost = asyncio.ensure_future(held.alost())
        released = True
        try:
            await asyncio.wait({section, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when `run` itself is cancelled: the section goes, then the lock.
            if not section.done():
                section.cancel()
                try:
                    await section
                except asyncio.CancelledError:
                    pass
            lost.cancel()
            try:
                await held.arelease()
            except NotHeld:
                released = False
        if section.cancelled() or not released:
            # Lost while the section ran (or before its end could be confirmed by the
            # release): its effects may overlap the next holder's.
            raise _expired(held)
        return section.result()

    def semaphore(self, permits: int) -> "Semaphore":
        """A fair counting semaphore: at most ``permits`` weight held at once per key."""
        return Semaphore(self, permits)

    def rw_lock(self) -> "RwLock":
        """A read-write lock: many readers or one writer per key, FIFO."""
        return RwLock(self)

    def status(self, key: str) -> dict:
        """What Redis holds for ``key`` now: ``{"held", "fence", "waiters"}``."""
        held, fence, waiters = self._n.status(key)
        return {"held": held, "fence": fence, "waiters": waiters}

    def idle(self) -> None:
        """Waits until this locker's background work (releases, departures) is done."""
        self._n.idle()


class Locker(_Base):
    """A polling locker: waiters retry with jittered exponential backoff."""

    _queued = False


class PubSubLocker(_Base):
    """A queued locker: waiters queue in Redis (FIFO across processes and languages), and the
    release hands the lock to the oldest live waiter, woken by a message. One subscriber
    connection per locker."""

    _queued = True


QueuedLocker = PubSubLocker


class Semaphore:
    """A fair counting semaphore over a locker (see :meth:`Locker.semaphore`)."""

    def __init__(self, locker: _Base, permits: int) -> None:
        self._locker = locker
        self.permits = permits

    def _args(self, key: str, weight: int, ttl: float, wait: float) -> dict:
        return dict(key=key, ttl=ttl, wait=wait, permits=self.permits, weight=weight)

    def acquire(self, key: str, weight: int = 1, *, ttl: float = 30.0, wait: float = 10.0) -> Held:
        """Acquires ``weight`` permits of ``key``, blocking."""
        return Held(self._locker._n.acquire(**self._args(key, weight, ttl, wait)))

    async def aacquire(self, key: str, weight: int = 1, *, ttl: float = 30.0, wait: float = 10.0) -> Held:
        """As :meth:`acquire`, awaited."""
        return Held(await _started(self._locker._n.acquire_start, **self._args(key, weight, ttl, wait)))

    def lock(self, key: str, weight: int = 1, *, ttl: float = 30.0, wait: float = 10.0) -> _Lock:
        """``with`` / ``async with`` the permits."""
        args = self._args(key, weight, ttl, wait)
        n = self._locker._n
        return _Lock(lambda: n.acquire(**args), lambda: _started(n.acquire_start, **args))


# A read-write lock's keys are permit keys with this many permits: a reader holds one, a
# writer all (the Rust library's MAX_PERMITS).
_RW_PERMITS = 1_048_576


class RwLock:
    """Many readers or one writer per key, FIFO (see :meth:`Locker.rw_lock`)."""

    def __init__(self, locker: _Base) -> None:
        self._sem = Semaphore(locker, _RW_PERMITS)

    def read(self, key: str, *, ttl: float = 30.0, wait: float = 10.0) -> _Lock:
        """A reader's hold: ``with rw.read(key):``."""
        return self._sem.lock(key, 1, ttl=ttl, wait=wait)

    def write(self, key: str, *, ttl: float = 30.0, wait: float = 10.0) -> _Lock:
        """The writer's hold: ``with rw.write(key):``."""
        return self._sem.lock(key, _RW_PERMITS, ttl=ttl, wait=wait)
