"""A generation server takes one join of a weight group at a time (runtime/control.py)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.control import ServerControl, UpdateRejected


class _Engine:
    """An engine whose worker takes ``tandem_join`` until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[tuple] = []

    async def collective_rpc(self, method: str, timeout: float, args: tuple) -> list:
        self.calls.append((method, args))
        await self.release.wait()
        return [True]


def test_a_second_join_while_one_is_under_way_is_refused_not_queued():
    """Before: the second join (a server listed twice) queued behind the first, which then
    waited 60 s for it and failed; the engine hung in the second's set-up for good."""

    async def scenario() -> None:
        engine = _Engine()
        control = ServerControl(engine, {})
        first = asyncio.create_task(control.join_group("127.0.0.1", 1, 1, 3, "gloo", 60.0))
        await asyncio.sleep(0)
        with pytest.raises(UpdateRejected, match="joining a weight group as rank 1") as err:
            await asyncio.wait_for(control.join_group("127.0.0.1", 1, 2, 3, "gloo", 60.0), 5)
        assert err.value.status == 409
        engine.release.set()
        await first
        await control.join_group("127.0.0.1", 2, 1, 2, "gloo", 60.0)  # a later join: taken
        assert [c[1][2] for c in engine.calls] == [1, 1]  # the refused one never reached it

    asyncio.run(scenario())
