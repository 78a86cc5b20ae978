"""A script that ends while callbacks of its operations are on their way exits cleanly: no
thread attaches to the interpreter while it finalizes (that aborted the process, "Fatal
Python error: PyGILState_Release", about 1 exit in 30 of this script)."""

import subprocess
import sys

SCRIPT = """
import asyncio, sys, waitlock
locker = waitlock.PubSubLocker(sys.argv[1])

async def section():
    async with locker.lock("exit", ttl=10, wait=5):
        await asyncio.sleep(0.001)

async def main():
    tasks = [asyncio.ensure_future(section()) for _ in range(3)]
    await asyncio.sleep(0.002)
    tasks[1].cancel()
    for t in tasks:
        try:
            await t
        except asyncio.CancelledError:
            pass

asyncio.run(main())
"""


def test_a_script_ending_with_callbacks_on_their_way_exits_cleanly(redis):
    for _ in range(30):
        run = subprocess.run([sys.executable, "-c", SCRIPT, redis.url], capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert "Fatal Python error" not in run.stderr, run.stderr
