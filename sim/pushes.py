"""Weight pushes from the trainer to the generation instances, priced and queued.

An instance in the trainer's datacenter receives a push at once: one broadcast reaches
every local instance together at the intra-datacenter bandwidth (as the live runtime's
one broadcast to all servers), and its engine keeps only the newest pending update. An
instance in another datacenter receives it when the link is free (``sim.links``): one
transfer over the link serves every instance behind it.
"""

from __future__ import annotations

from typing import Protocol

from policies.cluster import GenerationPool, NetworkSection
from policies.modes.events import InflightHandling, PushWeights
from policies.protocols import Device
from policies.resources import link_resource
from sim.costs import SimCostModel, link_transfer_s
from sim.engine import GenerationEngine
from sim.links import LinkPush, Links
from sim.ticks import to_ticks


class PushTarget(Protocol):
    engine: GenerationEngine
    pool: GenerationPool
    retired_s: float | None


class WeightPushes:
    """Hands each push to the instances, through the links of other datacenters."""

    def __init__(
        self, cost: SimCostModel, network: NetworkSection, source: str, links: Links
    ) -> None:
        self.cost = cost
        self.network = network
        self.source = source  # the trainer's datacenter
        self.links = links

    def push(self, instances: list[PushTarget], command: PushWeights) -> None:
        """Every live instance, in order; behind a busy link, when it is free."""
        started: dict[str, bool] = {}
        waiting: dict[str, list[PushTarget]] = {}
        for inst in (i for i in instances if i.retired_s is None):
            link = link_resource(self.source, inst.pool.datacenter)
            if inst.pool.datacenter != self.source and link not in started:
                waiting[link] = later = []
                transfer = self.transfer_s(inst.pool.datacenter)
                deliver = lambda c=command, insts=later: self._push_all(insts, c)  # noqa: E731
                self.links.send(LinkPush(link, command.version, transfer, deliver))
                started[link] = False  # its receivers get it when it is through
            if inst.pool.datacenter == self.source and link not in started:
                started[link] = True  # the broadcast inside: not queued, spanned as before
                self.links.note_broadcast(link, command.version, self.transfer_s(self.source))
            if started[link]:
                self._push_to(inst, command, self.transfer_s(self.source))
            else:
                waiting[link].append(inst)

    def _push_all(self, instances: list[PushTarget], command: PushWeights) -> None:
        """The receivers behind a link, once the weights are through it (the link's hold
        included their fan-out: nothing more to transfer)."""
        for inst in instances:
            if inst.retired_s is None:  # not retired while the link was busy
                self._push_to(inst, command, 0.0)

    def _push_to(self, inst: PushTarget, command: PushWeights, transfer: float) -> None:
        load = self.cost.weight_load_s(Device(inst.pool.hardware, inst.pool.tp))
        pause = (transfer if command.inflight != InflightHandling.BARRIER else 0.0) + load
        inst.engine.push_weights(
            command.version, command.inflight, to_ticks(pause), to_ticks(transfer)
        )

    def transfer_s(self, target: str) -> float:
        """The cost model's local push, plus any cross-datacenter link by its bandwidth."""
        net, num_bytes = self.network, self.cost.weight_bytes
        local = self.cost.weight_transfer_s(num_bytes, net.intra_dc_gbps, net.latency_s)
        if target == self.source:
            return local
        return local + link_transfer_s(num_bytes, net.inter_dc_gbps, net.latency_s)
