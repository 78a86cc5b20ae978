"""The Python benchmark: waitlock's queued and polling lockers beside redis-py's `Lock` and
python-redis-lock, on the Rust bench's shapes, in one run against one private redis-server;
then the Rust bench's queued handoff (`cargo bench --bench contention -- --only handoff
--locker pubsub`) in the same run, for the ratio.

Handoff: W workers over 4 processes (threads, as Celery/RQ/Dramatiq workers are) contend for
one key, each holding it 1 ms; gap = the next holder's acquisition - the last holder's
release (CLOCK_MONOTONIC, one clock for every process). Calls = the client's round trips per
acquisition (redis-py's `execute_command` counted for the redis-py locks; for waitlock the
commands only a client sends: scripts, script loads, (un)subscriptions, pings, as the Rust
bench counts them). Commands = every command Redis ran (scripts' own included). Fairness =
fewest / most acquisitions of one worker. Uncontended: 16 workers, each on its own key.

`bash python/dev bench` (installs redis and python-redis-lock into the venv). Options:
`--quick` (1 s a configuration), `--no-rust`.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROCS = 4
HOLD_S = 0.001
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis():
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server not found (Debian: apt-get install redis-server)")
    d = tempfile.mkdtemp(prefix="waitlock-pybench-")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    r = redis.Redis(port=port)
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None:
                sys.exit("redis-server did not start")
            time.sleep(0.01)
    return proc, port, r


# --- the lockers under test, each: setup(port) -> (acquire(key) -> handle, release(handle), calls())

class Counting:
    """A redis-py client whose round trips are counted."""

    def __init__(self, port: int):
        import redis

        self.calls = 0
        outer = self

        class R(redis.Redis):
            def execute_command(self, *args, **kw):
                outer.calls += 1
                return super().execute_command(*args, **kw)

        self.r = R(port=port)


def make(kind: str, port: int):
    url = f"redis://127.0.0.1:{port}"
    if kind in ("waitlock-pubsub", "waitlock-poll"):
        import waitlock

        locker = (waitlock.PubSubLocker if kind == "waitlock-pubsub" else waitlock.Locker)(url)

        def acquire(key):
            return locker.acquire(key, ttl=10, wait=60)

        return acquire, lambda h: h.release(), lambda: 0
    c = Counting(port)
    if kind.startswith("redis-py"):
        sleep = 0.1 if kind == "redis-py" else 0.002

        def acquire(key):
            lock = c.r.lock(key, timeout=10, sleep=sleep, blocking_timeout=60)
            assert lock.acquire()
            return lock

        return acquire, lambda lock: lock.release(), lambda: c.calls
    if kind == "python-redis-lock":
        import redis_lock

        def acquire(key):
            lock = redis_lock.Lock(c.r, key, expire=60)
            assert lock.acquire(blocking=True, timeout=60)
            return lock

        return acquire, lambda lock: lock.release(), lambda: c.calls
    raise ValueError(kind)


def worker_proc(kind, port, threads, base, duration, key_of, go, out):
    acquire, release, calls = make(kind, port)
    records = []
    lock = threading.Lock()

    def run(wid):
        key = key_of(wid)
        mine = []
        go.wait()
        until = time.monotonic() + duration
        while time.monotonic() < until:
            h = acquire(key)
            t0 = time.monotonic_ns()
            if HOLD_S:
                time.sleep(HOLD_S)
            t1 = time.monotonic_ns()
            release(h)
            mine.append((t0, t1, wid))
        with lock:
            records.extend(mine)

    ts = [threading.Thread(target=run, args=(base + i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((records, calls()))


def one_key(_wid):
    return "bench-handoff"


def own_key(wid):
    return f"bench-free-{wid}"


def commandstats(r):
    stats = r.info("commandstats")
    return {k[len("cmdstat_"):]: v["calls"] for k, v in stats.items()}


CLIENT_CMDS = ("evalsha", "eval", "script|load", "subscribe", "unsubscribe", "ssubscribe", "sunsubscribe", "ping")


def run_config(kind, port, r, workers, duration, key_of):
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    per = workers // PROCS
    procs = [ctx.Process(target=worker_proc, args=(kind, port, per, p * per, duration, key_of, go, out))
             for p in range(PROCS)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # every process connected (a queued locker subscribes) before the start
    before = commandstats(r)
    cpu0 = r.info("cpu")
    go.set()
    records, client_calls = [], 0
    for _ in procs:
        rec, calls = out.get()
        records.extend(rec)
        client_calls += calls
    for p in procs:
        p.join()
    after = commandstats(r)
    cpu1 = r.info("cpu")
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    commands = sum(v for k, v in delta.items() if not k.startswith("info") and not k.startswith("client") and k != "config|get")
    if kind.startswith("waitlock"):
        client_calls = sum(delta.get(k, 0) for k in CLIENT_CMDS)
    cpu_us = ((cpu1["used_cpu_sys"] + cpu1["used_cpu_user"]) - (cpu0["used_cpu_sys"] + cpu0["used_cpu_user"])) * 1e6
    return records, client_calls, commands, cpu_us


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def handoff_row(kind, workers, records, calls, commands, cpu_us, duration):
    recs = sorted(records)
    n = len(recs)
    gaps = [(b[0] - a[1]) / 1e6 for a, b in zip(recs, recs[1:])]
    # To another worker (the Rust bench's gap_diff): what a waiter waits after a release.
    diff = [(b[0] - a[1]) / 1e6 for a, b in zip(recs, recs[1:]) if a[2] != b[2]]
    overlaps = sum(1 for g in gaps if g < 0)
    per = {}
    for _, _, w in recs:
        per[w] = per.get(w, 0) + 1
    counts = [per.get(w, 0) for w in range(workers)]
    same = sum(1 for a, b in zip(recs, recs[1:]) if a[2] == b[2]) / max(1, n - 1)
    return {
        "locker": kind, "workload": "handoff", "workers": workers, "procs": PROCS,
        "acquisitions": n, "acq_per_s": n / duration,
        "gap_p50_ms": pct(gaps, 0.5), "gap_p99_ms": pct(gaps, 0.99),
        "gap_diff_p50_ms": pct(diff, 0.5), "gap_diff_p99_ms": pct(diff, 0.99),
        "calls_per_acq": calls / max(1, n), "commands_per_acq": commands / max(1, n),
        "redis_cpu_us_per_acq": cpu_us / max(1, n),
        "fairness": min(counts) / max(1, max(counts)), "same_worker_share": same,
        "violations": overlaps,
    }


def rust_handoff(quick: bool):
    """The Rust bench's queued handoff rows, run now (built if needed)."""
    args = ["cargo", "bench", "--locked", "--bench", "contention", "--", "--only", "handoff", "--locker", "pubsub"]
    if quick:
        args.append("--quick")
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=env)
    rows = {}
    for line in out.stdout.splitlines():
        if line.startswith("locker=pubsub") and "workload=handoff" in line:
            kv = dict(w.split("=", 1) for w in line.split())
            rows[int(kv["workers"])] = {
                "gap_p50_ms": float(kv["gap_all_p50_ms"]), "gap_p99_ms": float(kv["gap_all_p99_ms"]),
                "calls_per_acq": float(kv["calls_per_acq"]), "fairness": float(kv["fairness_min_over_max"]),
            }
    if not rows:
        print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
    return rows


def main():
    quick = "--quick" in sys.argv
    duration = 1.0 if quick else 5.0
    proc, port, r = start_redis()
    kinds = ["waitlock-pubsub", "waitlock-poll", "redis-py", "redis-py-2ms", "python-redis-lock"]
    rows = []
    try:
        print(f"waitlock Python benchmark, Redis {r.info('server')['redis_version']}, "
              f"{duration:.0f} s a configuration, hold {HOLD_S * 1e3:.0f} ms, {PROCS} processes")
        for workers in (8, 64):
            for kind in kinds:
                r.flushall()
                rec, calls, cmds, cpu = run_config(kind, port, r, workers, duration, one_key)
                row = handoff_row(kind, workers, rec, calls, cmds, cpu, duration)
                rows.append(row)
                print(json.dumps(row))
        for kind in kinds:
            r.flushall()
            rec, calls, cmds, cpu = run_config(kind, port, r, 16, duration, own_key)
            row = {"locker": kind, "workload": "uncontended", "workers": 16,
                   "pairs_per_s": len(rec) / duration, "calls_per_pair": calls / max(1, len(rec)),
                   "commands_per_pair": cmds / max(1, len(rec)),
                   "redis_cpu_us_per_pair": cpu / max(1, len(rec))}
            rows.append(row)
            print(json.dumps(row))
    finally:
        proc.kill()
        proc.wait()
    rust = {} if "--no-rust" in sys.argv else rust_handoff(quick)
    for w, row in rust.items():
        print(json.dumps({"locker": "rust-pubsub", "workload": "handoff", "workers": w, **row}))
    print()
    print("| locker | shape | gap p50 (to another worker) | gap p99 (to another) | gap p50 (any) | calls/acq | commands/acq | Redis CPU/acq | fairness | same worker | violations |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["workload"] == "handoff":
            print(f"| {row['locker']} | {row['workers']} x {PROCS} | {row['gap_diff_p50_ms']:.3f} ms | {row['gap_diff_p99_ms']:.3f} ms | {row['gap_p50_ms']:.3f} ms "
                  f"| {row['calls_per_acq']:.2f} | {row['commands_per_acq']:.1f} | {row['redis_cpu_us_per_acq']:.0f} µs "
                  f"| {row['fairness']:.2f} | {row['same_worker_share']:.2f} | {row['violations']} |")
    for w, row in sorted(rust.items()):
        print(f"| rust-pubsub (Rust bench) | {w} x {PROCS} | {row['gap_p50_ms']:.3f} ms | {row['gap_p99_ms']:.3f} ms | "
              f"| {row['calls_per_acq']:.2f} | | | {row['fairness']:.2f} | | |")
    print()
    print("| locker | uncontended pairs/s (16 workers) | calls/pair | commands/pair | Redis CPU/pair |")
    print("|---|---|---|---|---|")
    for row in rows:
        if row["workload"] == "uncontended":
            print(f"| {row['locker']} | {row['pairs_per_s']:.0f} | {row['calls_per_pair']:.2f} "
                  f"| {row['commands_per_pair']:.1f} | {row['redis_cpu_us_per_pair']:.0f} µs |")
    py = {row["workers"]: row for row in rows if row["locker"] == "waitlock-pubsub" and row["workload"] == "handoff"}
    for w, rr in sorted(rust.items()):
        if w in py and rr["gap_p50_ms"] > 0:
            print(f"Python / Rust queued handoff gap p50 at {w} x {PROCS}: {py[w]['gap_diff_p50_ms'] / rr['gap_p50_ms']:.2f}x")


if __name__ == "__main__":
    main()
