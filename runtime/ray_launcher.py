"""A live run on a Ray cluster: the spec's ``cluster`` section as Ray placement.

``tandem run SPEC --live --ray [ADDRESS]``: connects to the cluster at ADDRESS (``auto``:
the one ``ray start`` made on this machine), or starts a local one (``local``) bound to
127.0.0.1 and stops it at the end. Every generation instance of ``cluster.generation``
becomes a :class:`runtime.ray_actors.ServerActor` on its pool's placement group, the
trainer pool's ``num_gpus`` become FSDP2 ranks (:class:`runtime.ray_actors.TrainerRank`)
on theirs (:mod:`runtime.ray_placement`). Then :func:`runtime.live_run.drive` runs the
same actor loop, controller and policies as a local run. Ray starts, watches and stops
every process: a server whose actor or process dies is a lost instance (the run goes on
while another serves; ``live.restart_servers`` starts a new actor), a trainer rank that
dies stops the run with one line naming it, and on any exit — the end, Ctrl-C, a
failure — every actor and placement group of the run is removed.

Checkpoints are sharded (``checkpoints/last.dcp``) and must be on a file system every
trainer rank can write (one machine, or a shared mount); so must the run directory's
``logs/`` for the servers' logs. The package must be installed on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from policies.protocols import LengthPredictor
from policies.results import RunResult
from policies.spec import RunSpec
from runtime.attach import control_token, inference_key
from runtime.errors import LiveRunError, ProcessDied
from runtime.graceful_stop import StopRequests
from runtime.live_run import AfterStep, OnStep, drive, live_device, model_dir_for, trainer_config
from runtime.ray_actors import ANSWERS_GROUP, ServerActor, ServerSettings, TrainerRank
from runtime.ray_handles import RayServers, RayTrainerGroup
from runtime.ray_placement import (
    Bundle,
    RayPlan,
    ServerPlace,
    check_fits,
    check_plan,
    label_datacenters,
    plain_resources,
    plan,
)
from runtime.ray_session import LOCAL_RAY, check_reachable, ray_session
from runtime.run_dir import RunDir

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0  # a placement group not placed by then cannot be (resources)


def run_on_ray(
    spec: RunSpec, run_dir: RunDir, address: str, length_predictor: LengthPredictor | None,
    after_step: AfterStep | None, on_step: OnStep | None, stops: StopRequests | None = None,
) -> RunResult:  # fmt: skip
    """Place, start, run and remove the run's actors on the cluster at ``address``."""
    layout = check_ray_run(spec, address)
    with ray_session(address) as ray:
        label = label_datacenters(layout, ray.cluster_resources())
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")] if label else None
        check_fits(spec, layout, ray.cluster_resources(), label, nodes)  # else Ray waits
        placement = Placement(ray, layout, label)
        servers: RayServers | None = None
        trainer: RayTrainerGroup | None = None
        try:
            placement.place()
            servers, trainer = _make(ray, spec, run_dir, placement)
            run = _start_and_drive(
                spec, run_dir, servers, trainer, length_predictor, after_step, on_step, stops
            )
            return asyncio.run(run)
        except ProcessDied as err:  # the last server or a trainer rank: resume from the checkpoint
            raise LiveRunError(f"{err}; {run_dir.how_to_go_on()}") from None
        finally:
            if servers is not None:
                servers.stop_all()
            if trainer is not None:  # within a stop's deadline only (docs/ray.md)
                trainer.stop(stops.grace_left_s(0.0) if stops is not None else 0.0)
            placement.remove()


def check_ray_run(spec: RunSpec, address: str) -> RayPlan:
    """The run's placement, or a ``ValueError`` naming the key that ``--ray`` cannot run
    (before the run directory, Ray or any server is touched)."""
    if address != LOCAL_RAY:
        check_reachable(address)  # no form Ray takes, nothing there, or no Ray GCS
    layout = plan(spec, gpu=live_device(spec) == "cuda")
    check_plan(spec, layout, own_ray=address == LOCAL_RAY)
    return layout


async def _start_and_drive(
    spec, run_dir, servers, trainer, length_predictor, after_step, on_step, stops=None
):
    log.info("starting %d server actor(s) and %d trainer rank(s)", len(servers.planned),
             len(trainer.ranks))  # fmt: skip
    await asyncio.gather(trainer.start(), *(servers.add(i) for i in servers.planned))
    placed = {**trainer.placements(), **servers.placements()}
    run_dir.record_processes({name: p.pid for name, p in placed.items()})
    run_dir.record_placement({name: dataclasses.asdict(p) for name, p in placed.items()})
    own_gpus = live_device(spec) == "cuda"  # each server and rank has a bundle of GPUs
    # no CPU by role: the actors are not this process's children (and may be on any node)
    return await drive(
        spec, run_dir, trainer, servers, length_predictor, after_step, on_step, own_gpus,
        host_cpu=False, stops=stops,
    )  # fmt: skip


class Placement:
    """The run's placement groups: one per generation pool (spread over nodes), one for
    the trainer (packed), and one per server added by elastic scale-out."""

    def __init__(self, ray: Any, layout: RayPlan, label: bool) -> None:
        self.ray, self.layout, self.label = ray, layout, label
        self.pools: list[Any] = []
        self.trainer: Any = None
        self.extra: dict[int, Any] = {}  # instance id -> its own group (scale-out)

    def place(self) -> None:
        """Create the pools' and the trainer's groups; wait until each is placed."""
        from ray.util.placement_group import placement_group

        for p in range(self.layout.num_pools):
            bundles = [b.resources(self.label) for b in self.layout.pool_bundles(p)]
            self.pools.append(placement_group(bundles, strategy="SPREAD", name=f"tandem-gen-{p}"))
        ranks = [b.resources(self.label) for b in self.layout.trainer]
        self.trainer = placement_group(ranks, strategy="PACK", name="tandem-trainer")
        names = [f"cluster.generation[{p}]" for p in range(len(self.pools))]
        for name, group in zip([*names, "cluster.trainer"], [*self.pools, self.trainer]):
            ready, _ = self.ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                raise LiveRunError(
                    f"Ray could not place {name} ({group.bundle_specs}) within "
                    f"{PLACEMENT_TIMEOUT_S:.0f} s; the cluster has free "
                    f"{plain_resources(self.ray.available_resources())}"
                )

    async def server(self, instance_id: int) -> tuple[ServerPlace, dict[str, Any]]:
        """Where server ``instance_id`` goes and its actor options; an instance the spec
        does not place (scale-out) gets a group of one bundle of pool 0's shape."""
        planned = {s.instance_id: s for s in self.layout.servers}
        if instance_id in planned:
            place = planned[instance_id]
            return place, self._on(self.pools[place.pool], place.bundle_index, place.bundle)
        from ray.util.placement_group import placement_group

        place = dataclasses.replace(self.layout.servers[0], instance_id=instance_id)
        group = placement_group([place.bundle.resources(self.label)], name=f"tandem-gen-{instance_id}")  # fmt: skip
        self.extra[instance_id] = group
        try:  # a group Ray cannot place stays pending for good: the scale-out would never end
            await asyncio.wait_for(_awaited(group.ready()), PLACEMENT_TIMEOUT_S)
        except TimeoutError:
            del self.extra[instance_id]
            with contextlib.suppress(Exception):
                self.ray.util.remove_placement_group(group)
            raise LiveRunError(
                f"Ray could not place scale-out server {instance_id} ({group.bundle_specs}) "
                f"within {PLACEMENT_TIMEOUT_S:.0f} s; the cluster has free "
                f"{plain_resources(self.ray.available_resources())}"
            ) from None
        return place, self._on(group, 0, place.bundle)

    def rank(self, rank: int) -> dict[str, Any]:
        return self._on(self.trainer, rank, self.layout.trainer[rank])

    def _on(self, group: Any, index: int, bundle: Bundle) -> dict[str, Any]:
        """Actor options: the bundle's resources, on that bundle of ``group``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        resources = bundle.resources(self.label)
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        return {"num_cpus": resources["CPU"], "num_gpus": resources.get("GPU", 0),
                "resources": custom, "scheduling_strategy": strategy, "max_restarts": 0}  # fmt: skip

    def remove(self) -> None:
        for group in [*self.pools, self.trainer, *self.extra.values()]:
            if group is not None:
                with contextlib.suppress(Exception):
                    self.ray.util.remove_placement_group(group)


async def _awaited(ref: Any) -> Any:
    """A Ray object reference as a coroutine (``asyncio.wait_for`` takes one)."""
    return await ref


def _make(ray, spec, run_dir, placement: Placement) -> tuple[RayServers, RayTrainerGroup]:
    """The (not yet started) servers and trainer ranks, each on its bundle."""
    model_dir = model_dir_for(spec)
    token = control_token(spec.live)
    server_actor = ray.remote(ServerActor)
    rank_actor = ray.remote(concurrency_groups={ANSWERS_GROUP: 1})(TrainerRank)

    async def make_server(i: int) -> Any:
        place, options = await placement.server(i)
        settings = _settings(spec, place.pool, model_dir, token, run_dir, place.bundle.num_cpus)
        return server_actor.options(**options).remote(i, settings)

    live, layout = spec.live, placement.layout
    planned = [s.instance_id for s in layout.servers]
    servers = RayServers(planned, token, make_server, live.restart_servers, live.startup_timeout_s)
    config = trainer_config(spec, model_dir)
    world, device = len(layout.trainer), config.device
    ranks = [
        rank_actor.options(**placement.rank(k)).remote(config, k, world, device)
        for k in range(world)
    ]
    return servers, RayTrainerGroup(ranks)


def _settings(
    spec, pool: int, model_dir: str, token: str, run_dir: RunDir, cpus: float
) -> ServerSettings:
    live, limits = spec.live, spec.cluster.generation[pool]
    return ServerSettings(
        model_dir=model_dir, token=token, kv_cache_gib=live.kv_cache_gib,
        max_model_len=live.max_model_len, max_num_seqs=limits.max_num_seqs,
        log_dir=str(run_dir.path / "logs"), startup_timeout_s=live.startup_timeout_s,
        api_key=inference_key(live), cores_per_server=max(1, int(cpus)), engine_nice=live.engine_nice or 0,
    )  # fmt: skip
