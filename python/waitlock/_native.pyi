"""Type stubs of the native half (`python/src/lib.rs`); the public API is `waitlock`."""

from typing import Any, Callable, List, Optional, Tuple

class WaitlockError(Exception):
    key: str

class WaitTimeout(WaitlockError):
    waited: float
    attempts: int

class Locked(WaitlockError):
    remaining_ttl: Optional[float]

class Expired(WaitlockError):
    reason: str

class NotHeld(WaitlockError): ...
class ConnectError(WaitlockError): ...

class InvalidArgument(WaitlockError):
    field: str

class RedisError(WaitlockError): ...
class ForkError(WaitlockError): ...

_Callback = Callable[[Any, Optional[BaseException]], None]

def shutdown() -> None:
    """At interpreter exit: no callback attaches to the interpreter from now on."""

class Pending:
    def cancel(self) -> None: ...

class Held:
    key: str
    keys: List[str]
    fence: int
    fences: List[Tuple[str, int]]
    token: str
    lost: Optional[str]
    def wait_lost(self, timeout: Optional[float] = None) -> Optional[str]: ...
    def wait_lost_start(self, event_loop: Any, callback: _Callback) -> Pending: ...
    def release(self) -> None: ...
    def release_start(self, event_loop: Any, callback: _Callback) -> Pending: ...
    def extend(self, ttl: float) -> None: ...
    def extend_start(self, event_loop: Any, callback: _Callback, ttl: float) -> Pending: ...
    def discard(self) -> None: ...

class NativeLocker:
    queued: bool
    def __init__(
        self,
        url: str,
        queued: bool,
        prefix: Optional[str] = None,
        command_timeout: Optional[float] = None,
        label: Optional[str] = None,
    ) -> None: ...
    def acquire(
        self,
        key: str,
        ttl: float,
        wait: float,
        refresh: bool = True,
        permits: Optional[int] = None,
        weight: int = 1,
        keys: Optional[List[str]] = None,
        ordered: bool = False,
    ) -> Held: ...
    def acquire_start(
        self,
        event_loop: Any,
        callback: _Callback,
        key: str,
        ttl: float,
        wait: float,
        refresh: bool = True,
        permits: Optional[int] = None,
        weight: int = 1,
        keys: Optional[List[str]] = None,
        ordered: bool = False,
    ) -> Pending: ...
    def status(self, key: str) -> Tuple[bool, Optional[int], int]: ...
    def idle(self) -> None: ...
