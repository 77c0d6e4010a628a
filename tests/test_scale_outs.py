"""How a live scale-out ends (``runtime.scale_outs``): once, at the server settled last,
with its ``InstanceAdded`` (``from_scale_out``) if it joined, else with the failure's
reason, which counts the servers that did join."""

from __future__ import annotations

from runtime.scale_outs import ScaleOuts


def test_a_scale_out_ends_at_its_last_server_to_join():
    failed: list[str] = []
    outs = ScaleOuts(failed.append)
    track = outs.begin(2)
    outs.started(track, 2)
    assert outs.joined(2) is False  # server 3 is not started yet
    outs.started(track, 3)
    assert outs.joined(3) is True
    assert outs.joined(3) is False  # joined again after a restart: answers no scale-out
    outs.lost(2, "server 2 was lost")  # after it joined: nothing
    assert failed == []


def test_a_scale_out_whose_last_server_does_not_join_fails_once_saying_how_many_did():
    failed: list[str] = []
    outs = ScaleOuts(failed.append)
    track = outs.begin(3)
    outs.gave_up(track, "server 2 did not start (exited)")
    outs.started(track, 3)
    outs.started(track, 4)
    assert outs.joined(3) is False
    outs.lost(4, "server 4 was lost before it joined (killed)")
    outs.lost(4, "server 4 was lost again")
    assert failed == ["added 1 of 3 servers: server 4 was lost before it joined (killed)"]


def test_a_scale_out_whose_every_server_is_lost_added_none():
    failed: list[str] = []
    outs = ScaleOuts(failed.append)
    track = outs.begin(2)
    outs.started(track, 2)
    outs.started(track, 3)
    outs.lost(3, "server 3 was lost before it joined (killed)")
    assert failed == []  # server 2 may still join
    outs.lost(2, "server 2 was lost before it joined and its restart failed (exited)")
    assert failed == [
        "added no server: server 2 was lost before it joined and its restart failed (exited)"
    ]


def test_two_scale_outs_under_way_end_each_on_their_own_servers():
    failed: list[str] = []
    outs = ScaleOuts(failed.append)
    first, second = outs.begin(2), outs.begin(1)
    outs.started(first, 2)
    outs.started(first, 3)
    outs.started(second, 4)
    assert outs.joined(2) is False
    assert outs.joined(4) is True  # the second's only server ends it, not the first
    outs.lost(3, "server 3 was lost before it joined (killed)")
    assert failed == ["added 1 of 2 servers: server 3 was lost before it joined (killed)"]
