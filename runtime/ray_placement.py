"""Where a live run's processes go on a Ray cluster: the spec's ``cluster`` section as
placement groups.

Each generation pool becomes one placement group of ``num_instances`` bundles (one per
vLLM server: ``tp`` GPUs, or ``tp`` CPUs on a CPU cluster), the trainer pool one group
of ``num_gpus`` bundles (one per FSDP rank), packed onto as few nodes as possible. A
datacenter is a custom resource that the cluster's nodes advertise
(``ray start --resources='{"datacenter_dc1": 1000}'``): every bundle of a pool asks
for a sliver of its datacenter's resource, so a ``balanced`` cross-datacenter split lands
where the spec says. A cluster that advertises no datacenter at all places a
single-datacenter spec anywhere; a spec spanning datacenters that the cluster does not
advertise is an error naming the resource to add.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.spec import RunSpec

DATACENTER_PREFIX = "datacenter_"
DATACENTER_SLIVER = 0.001  # of a datacenter resource per bundle: a label, not a quantity


def datacenter_resource(datacenter: str) -> str:
    return f"{DATACENTER_PREFIX}{datacenter}"


@dataclass(frozen=True, slots=True)
class Bundle:
    """One process's share of a node: what its placement-group bundle asks for."""

    num_cpus: float
    num_gpus: float
    datacenter: str

    def resources(self, label_datacenter: bool) -> dict[str, float]:
        out = {"CPU": self.num_cpus}
        if self.num_gpus:
            out["GPU"] = self.num_gpus
        if label_datacenter:
            out[datacenter_resource(self.datacenter)] = DATACENTER_SLIVER
        return out


@dataclass(frozen=True, slots=True)
class ServerPlace:
    instance_id: int
    pool: int  # index into cluster.generation
    bundle_index: int  # within its pool's placement group
    bundle: Bundle


@dataclass(frozen=True, slots=True)
class RayPlan:
    servers: tuple[ServerPlace, ...]
    trainer: tuple[Bundle, ...]  # one per rank
    num_pools: int

    @property
    def datacenters(self) -> set[str]:
        return {s.bundle.datacenter for s in self.servers} | {b.datacenter for b in self.trainer}

    def pool_bundles(self, pool: int) -> list[Bundle]:
        return [s.bundle for s in self.servers if s.pool == pool]


def plan(spec: RunSpec, gpu: bool) -> RayPlan:
    """Every server and trainer rank of ``spec`` with its bundle (``gpu``: a CUDA cluster,
    else one CPU per tensor-parallel rank)."""
    servers = []
    for p, pool in enumerate(spec.cluster.generation):
        cpus, gpus = (1.0, float(pool.tp)) if gpu else (float(pool.tp), 0.0)
        for k in range(pool.num_instances):
            bundle = Bundle(cpus, gpus, pool.datacenter)
            servers.append(ServerPlace(len(servers), p, k, bundle))
    t = spec.cluster.trainer
    rank = Bundle(1.0, 1.0 if gpu else 0.0, t.datacenter)
    return RayPlan(tuple(servers), (rank,) * t.num_gpus, len(spec.cluster.generation))


def check_plan(spec: RunSpec, plan_: RayPlan, own_ray: bool = False) -> None:
    """What ``--ray`` cannot run, refused before Ray or any server starts, naming the key:
    servers asked for two ways, a trainer option the sharded trainer lacks, and (``own_ray``:
    a Ray this command starts, one node without datacenter resources) several datacenters."""
    n = len(plan_.servers)
    if spec.live.server_urls:
        raise ValueError("live.server_urls attaches to running servers; --ray starts its own")
    if spec.live.compile_trainer:  # ShardedTrainer refuses it, but only ~a minute later
        raise ValueError(
            "live.compile_trainer: the sharded trainer of a --ray run does not compile; "
            "set live.compile_trainer=false or run without --ray"
        )
    if own_ray and len(plan_.datacenters) > 1:
        raise ValueError(
            f"the spec places processes in datacenters {sorted(plan_.datacenters)}: that needs "
            "a Ray cluster whose nodes advertise them (ray start --resources=...), given with "
            "--ray ADDRESS; --ray alone starts a one-node Ray of the command's own"
        )
    if spec.live.num_servers not in (1, n):
        raise ValueError(
            f"live.num_servers ({spec.live.num_servers}) differs from the "
            f"{n} generation instance(s) of cluster.generation; under --ray the cluster "
            "section places the servers (set num_gpus / tp there)"
        )


def label_datacenters(plan_: RayPlan, cluster_resources: dict[str, float]) -> bool:
    """Whether bundles must ask for their datacenter's resource; raises if the spec spans
    datacenters the cluster does not advertise."""
    advertised = {k for k in cluster_resources if k.startswith(DATACENTER_PREFIX)}
    if not advertised and len(plan_.datacenters) == 1:
        return False
    missing = sorted(
        datacenter_resource(dc)
        for dc in plan_.datacenters
        if datacenter_resource(dc) not in advertised
    )
    if missing:
        raise ValueError(
            f"the spec places processes in datacenter(s) {sorted(plan_.datacenters)} but no "
            f"Ray node advertises {', '.join(missing)}: start each node with e.g. "
            f"ray start --resources='{{\"{missing[0]}\": 1000}}'"
        )
    return True


def plain_resources(resources: dict[str, float]) -> dict[str, float]:
    """``resources`` without Ray's internal ones (``node:…``, and the ``…_group_…`` that
    each placement group adds): CPU, GPU, memory and the custom resources a user set."""
    return {
        k: v for k, v in resources.items()
        if not k.startswith("node:") and "_group_" not in k and not k.startswith("bundle_group")
    }  # fmt: skip


def check_fits(
    spec: RunSpec,
    plan_: RayPlan,
    cluster: dict[str, float],
    label: bool,
    nodes: list[dict[str, float]] | None = None,
) -> None:
    """A ``ValueError`` where the plan can never be placed on a cluster of ``cluster``'s total
    resources (Ray would wait for ever): a pool, the trainer, or all of them together asks
    for more than the cluster has; or, given each live node's resources (``nodes``), what
    one datacenter's processes ask for is more than its nodes have."""
    if any(b.num_gpus for b in plan_.trainer) and not cluster.get("GPU"):
        raise ValueError(f"live.device={spec.live.device}: the Ray cluster has no GPU")
    groups = {f"cluster.generation[{p}]": plan_.pool_bundles(p) for p in range(plan_.num_pools)}
    groups["cluster.trainer"] = list(plan_.trainer)
    groups["the run (every pool and the trainer)"] = [b for g in list(groups.values()) for b in g]
    for name, bundles in groups.items():
        for key, need in _summed([b.resources(label) for b in bundles]).items():
            if need > cluster.get(key, 0.0) + 1e-9:
                raise ValueError(
                    f"{name} needs {need:g} {key}, the Ray cluster has {cluster.get(key, 0.0):g}"
                )
    if label and nodes is not None:
        _check_datacenters(groups, nodes)


def _check_datacenters(groups: dict[str, list[Bundle]], nodes: list[dict[str, float]]) -> None:
    """Each datacenter's bundles against the nodes that advertise it (a bundle is placed on
    one node, so the cluster's total can hold what one datacenter's nodes cannot)."""
    needs: dict[str, dict[str, float]] = {}  # datacenter resource -> resource -> summed need
    names: dict[str, list[str]] = {}
    for name, bundles in list(groups.items())[:-1]:  # not the run's sum again
        for bundle in (b.resources(True) for b in bundles):
            where = next((k for k in bundle if k.startswith(DATACENTER_PREFIX)), None)
            if where is None:
                continue
            need = needs.setdefault(where, {})
            for key, value in bundle.items():
                if not key.startswith(DATACENTER_PREFIX):
                    need[key] = need.get(key, 0.0) + value
            if name not in names.setdefault(where, []):
                names[where].append(name)
    for where, need in needs.items():
        have = _summed([n for n in nodes if n.get(where)])
        for key, value in need.items():
            if value > have.get(key, 0.0) + 1e-9:
                dc = where.removeprefix(DATACENTER_PREFIX)
                raise ValueError(
                    f"{' and '.join(names[where])} in datacenter {dc} need {value:g} {key}, "
                    f"the Ray nodes advertising {where} have {have.get(key, 0.0):g}"
                )


def _summed(bundles: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            out[key] = out.get(key, 0.0) + value
    return out
