"""The generation stream's heartbeats (runtime/batch_gen.py::drain), without a server."""

from __future__ import annotations

import asyncio

from runtime.batch_gen import drain


def _collect(steps_grow: bool) -> list[bytes]:
    async def scenario() -> list[bytes]:
        lines: asyncio.Queue[bytes] = asyncio.Queue()
        steps = {"n": 0}

        async def engine() -> None:
            for _ in range(30):  # ~0.3 s of engine steps, then two samples at once
                await asyncio.sleep(0.01)
                steps["n"] += steps_grow
            lines.put_nowait(b"a\n")
            lines.put_nowait(b"b\n")

        task = asyncio.create_task(engine())
        out = [c async for c in drain(lines, 2, lambda: steps["n"], heartbeat_s=0.05)]
        await task
        return out

    return asyncio.run(scenario())


def test_heartbeats_while_the_engine_steps_and_none_while_it_does_not():
    stepping = _collect(steps_grow=True)
    assert stepping[-1] == b"a\nb\n"  # both samples in one chunk, last
    assert stepping[:-1] and set(stepping[:-1]) == {b"\n"}
    stuck = _collect(steps_grow=False)  # a stuck engine: its silence reaches the client
    assert stuck == [b"a\nb\n"]
