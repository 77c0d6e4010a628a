"""Which scale-out each added server belongs to, and which server's outcome ends it.

A controller's ``ScaleOut`` of n servers is over once each of its servers has either
joined the weight group or been given up on: its start failed, or it was lost before it
joined and is not started again (restarts off or used up, or its restart failed). The
server settled last ends it, so every ``ScaleOut`` ends exactly once: with that server's
``InstanceAdded`` (``from_scale_out`` true; the others' say false) if it joined, else with
one ``ScaleOutFailed``, whose reason says how many of the n joined. Until then the
controller decides nothing more (one scale-out at a time), so it next decides knowing how
many servers the whole addition brought, as in the simulator, which adds them at once.
A server's restart after it joined answers no scale-out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class ScaleOutTrack:
    """One ``ScaleOut`` under way."""

    num_servers: int  # asked for
    num_open: int  # neither joined nor given up on (those not started yet included)
    num_joined: int = 0


class ScaleOuts:
    """The scale-outs under way, by server (:class:`runtime.server_faults.ServerFaults`);
    ``failed`` is told the reason of each that ends without its last server."""

    def __init__(self, failed: Callable[[str], None]) -> None:
        self.failed = failed
        self._track_of: dict[int, ScaleOutTrack] = {}  # instance -> its open scale-out

    def begin(self, num_servers: int) -> ScaleOutTrack:
        assert num_servers > 0, "a ScaleOut adds at least one server"
        return ScaleOutTrack(num_servers, num_servers)

    def started(self, track: ScaleOutTrack, instance_id: int) -> None:
        """Server ``instance_id`` of ``track`` is healthy; it joins at the next push."""
        self._track_of[instance_id] = track

    def joined(self, instance_id: int) -> bool:
        """The server joined the weight group: True if that ends its scale-out (its
        ``InstanceAdded`` then says ``from_scale_out``); False for one that answers none."""
        track = self._track_of.pop(instance_id, None)
        if track is None:
            return False
        track.num_open -= 1
        track.num_joined += 1
        return track.num_open == 0

    def lost(self, instance_id: int, reason: str) -> None:
        """A server will not join (``reason``). Nothing for one of no open scale-out (it
        joined before, or no scale-out added it)."""
        if (track := self._track_of.pop(instance_id, None)) is not None:
            self.gave_up(track, reason)

    def gave_up(self, track: ScaleOutTrack, reason: str) -> None:
        """A server of ``track`` will not join (``reason``: its start failed, say); where it
        was the last one open, the scale-out failed."""
        track.num_open -= 1
        if track.num_open > 0:
            return
        if track.num_joined == 0:
            self.failed(f"added no server: {reason}")
        else:
            self.failed(f"added {track.num_joined} of {track.num_servers} servers: {reason}")
