"""What a ``--ray`` run refuses before Ray or any server starts, and how its errors read
(no Ray cluster needed): one line naming the key, the address or the process, never
Ray's traceback or its internal resources."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import types
from pathlib import Path

import pytest

import runtime.ray_session
from experiments.cli import main
from policies.spec import load_spec
from runtime import ray_launcher
from runtime.errors import LiveRunError, ProcessDied
from runtime.ray_handles import RayTrainerGroup, _one_line
from runtime.ray_placement import check_fits, check_plan, plain_resources, plan
from runtime.ray_session import connect, ray_endpoint
from runtime.run_dir import RunDir

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"

# Ray 2.60's message for an actor killed by SIGKILL (ids shortened)
ACTOR_DIED = """The actor died unexpectedly before finishing this task.
\tclass_name: TrainerRank
\tactor_id: 029e50ded47f
\tpid: 15210
\tnamespace: 6d242783
\tip: 127.0.0.1
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR \
Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. \
Some common causes include: (1) the process was killed by the OOM killer due to high \
memory usage, (2) ray stop --force was called, or (3) the worker crashed unexpectedly."""


def _spec(*sets: str):
    return load_spec(CONFIG, list(sets))


def test_a_dead_actor_is_named_by_rays_reason_without_its_ids_or_advice():
    line = _one_line(RuntimeError(ACTOR_DIED))
    assert line.startswith("The actor died unexpectedly before finishing this task.")
    assert "connection error code 2" in line
    assert "Some common causes" not in line and "actor_id" not in line and "\n" not in line


def _rank_died_on_ray(monkeypatch, tmp_path, checkpointed: bool) -> tuple[RunDir, str]:
    died = ProcessDied("trainer rank 0 (Ray actor, pid 7) died during step: gone.")

    class FakeRay:
        def cluster_resources(self):
            return {"CPU": 8.0}

    class FakePlacement:
        def __init__(self, *args):
            pass

        place = remove = lambda self: None

    def fake_drive(*args):
        raise died

    monkeypatch.setattr(ray_launcher, "ray_session", lambda address: _yielding(FakeRay()))
    monkeypatch.setattr(ray_launcher, "Placement", FakePlacement)
    monkeypatch.setattr(ray_launcher, "_make", lambda *a: (_Stops(), _Stops()))
    monkeypatch.setattr(ray_launcher, "_start_and_drive", lambda *a: fake_drive())
    run_dir = RunDir(tmp_path / "run", "local")
    if checkpointed:
        run_dir.checkpoint.mkdir(parents=True)  # last.dcp, a directory
    spec = _spec("live.device=cpu")
    with pytest.raises(LiveRunError) as caught:
        ray_launcher.run_on_ray(spec, run_dir, "local", None, None, None)
    return run_dir, str(caught.value)


def test_a_trainer_rank_that_dies_on_ray_ends_with_the_resume_command(monkeypatch, tmp_path):
    """Before: only a lost server got ``resume with:``; a dead rank ended without it."""
    run_dir, message = _rank_died_on_ray(monkeypatch, tmp_path, checkpointed=True)
    assert message.startswith("trainer rank 0 (Ray actor, pid 7) died during step: gone.")
    assert message.endswith(f"; resume with: tandem run {run_dir.spec_path} --live --ray "
                            f"--out {run_dir.path}")  # fmt: skip


def test_a_rank_that_dies_on_ray_before_a_checkpoint_says_the_run_starts_again(
    monkeypatch, tmp_path
):
    """Before: "resume with: ..." although no step was checkpointed to resume from."""
    run_dir, message = _rank_died_on_ray(monkeypatch, tmp_path, checkpointed=False)
    assert message.endswith(
        "; no step was checkpointed yet: running it again starts from step 0: "
        f"tandem run {run_dir.spec_path} --live --ray --out {run_dir.path}"
    )


class _Stops:
    def stop_all(self):
        pass

    def stop(self, grace_s: float = 0.0):
        pass


class _yielding:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


def test_a_ranks_own_exception_is_one_line_not_rays_traceback():
    """Before: ``RuntimeError: trainer rank 0 joining the process group failed:
    ray::TrainerRank.init_group() (pid=…) ^^^^ File …`` — the reason cut off."""
    from ray.exceptions import RayTaskError

    cause = ValueError("live.compile_trainer: the sharded trainer does not compile")
    wrapped = RayTaskError("init_group", "Traceback ... ^^^^", cause).as_instanceof_cause()

    async def raising():
        raise wrapped

    group = RayTrainerGroup([object()])
    with pytest.raises(LiveRunError) as caught:
        asyncio.run(group._await(0, "joining the process group", raising()))
    assert str(caught.value) == (
        "trainer rank 0 joining the process group failed: ValueError: "
        "live.compile_trainer: the sharded trainer does not compile"
    )


def test_compile_trainer_under_ray_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    """Before: ~50 s of start-up, then a traceback without the reason."""
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(k))
    out = tmp_path / "x"
    code = main(["run", "live-tiny", "--live", "--ray", "--set", "live.compile_trainer=true",
                 "--set", "live.device=cpu", "--out", str(out)])  # fmt: skip
    printed = " ".join(capsys.readouterr().out.split())
    assert code == 2 and started == []  # refused before Ray (or any process) started
    assert "live.compile_trainer: the sharded trainer of a --ray run does not compile" in printed
    assert not (out / "spec.yaml").exists()


def test_several_datacenters_need_a_cluster_given_by_address():
    spec = _spec("cluster.trainer.datacenter=dc1")
    with pytest.raises(ValueError, match=r"\['dc0', 'dc1'\].*--ray ADDRESS"):
        check_plan(spec, plan(spec, gpu=False), own_ray=True)
    check_plan(spec, plan(spec, gpu=False), own_ray=False)  # a cluster may advertise them


def test_a_placement_that_can_never_fit_is_refused_at_once():
    """Before: 120 s of waiting, then Ray's internal resources."""
    four = _spec("cluster.generation.0.num_gpus=4", "live.num_servers=4")
    with pytest.raises(ValueError, match=r"^cluster.generation\[0\] needs 4 CPU, the Ray "
                       r"cluster has 2$"):  # fmt: skip
        check_fits(four, plan(four, gpu=False), {"CPU": 2.0, "memory": 1e9}, False)
    one = _spec()
    with pytest.raises(ValueError, match=r"^the run \(every pool and the trainer\) needs 2 CPU"):
        check_fits(one, plan(one, gpu=False), {"CPU": 1.0}, False)
    check_fits(one, plan(one, gpu=False), {"CPU": 2.0}, False)
    cuda = _spec("live.device=cuda")
    with pytest.raises(ValueError, match=r"^live.device=cuda: the Ray cluster has no GPU$"):
        check_fits(cuda, plan(cuda, gpu=True), {"CPU": 16.0}, False)


def test_the_timeout_lists_only_plain_resources():
    free = {
        "node:__internal_head__": 1.0, "node:127.0.0.1": 1.0, "CPU": 1.0, "memory": 5.0,
        "bundle_group_dc34": 1000.0, "CPU_group_0_dc34": 1.0, "bundle_group_0_dc34": 1000.0,
        "CPU_group_dc34": 1.0, "datacenter_dc0": 1000.0,
    }  # fmt: skip
    assert plain_resources(free) == {"CPU": 1.0, "memory": 5.0, "datacenter_dc0": 1000.0}


@pytest.mark.parametrize(
    "address, found",
    [(":6379", "not a Ray address"), ("bogus", "not a Ray address"),
     ("http://127.0.0.1:6379", "not a Ray address (http://)"),
     ("127.0.0.1:99999", "not a Ray address")],
)  # fmt: skip
def test_a_malformed_ray_address_is_one_line_naming_ray(address, found):
    with pytest.raises(ValueError) as caught:
        ray_endpoint(address)
    assert str(caught.value).startswith(f"--ray {address}: {found}")
    assert "ray://HOST:PORT" in str(caught.value)


@pytest.mark.parametrize("command", [["run", "live-tiny", "--live"], ["sweep", "streamrl-7b"]])
def test_the_parser_refuses_a_malformed_ray_address(command, tmp_path, capsys):
    """Before: refused only after ~10 s of imports, once the run had begun."""
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--ray", "http://127.0.0.1:6379", "--out", str(tmp_path / "out")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "argument --ray: http://127.0.0.1:6379: not a Ray address (http://)" in err
    assert not (tmp_path / "out").exists()


def test_the_forms_ray_takes_are_parsed():
    assert ray_endpoint("auto") is None
    assert ray_endpoint("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert ray_endpoint("ray://head:10001") == ("head", 10001)
    assert ray_endpoint("[::1]:6379") == ("::1", 6379)


def test_a_ray_client_address_where_nothing_listens_stops_at_once():
    """Before: a UserWarning, then an error after 37 s (inside ``ray.init``). The stand-in
    for the ray module has no ``init``: reaching it would raise ``AttributeError``."""
    from runtime.procs import free_port

    address = f"ray://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match=r"no Ray cluster answers there"):
        connect(object(), address)  # type: ignore[arg-type]  # never reaches ray.init


def test_a_cluster_that_answers_but_refuses_says_how_to_give_it_a_token(monkeypatch):
    """Seen: ``ray start --head`` (token authentication on by default), then ``--ray
    HOST:PORT``: Ray sends no token to a named address unless asked, and the run ended
    in 'Failed to connect ...; start one (ray start --head)' for a cluster that was up."""
    import socket
    import types

    def refusing_init(**kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}.")

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(runtime.ray_session, "not_a_gcs", lambda endpoint: None)  # a GCS
    with socket.create_server(("127.0.0.1", 0)) as listening:
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(ValueError) as caught:
            connect(types.SimpleNamespace(init=refusing_init), address)  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith(f"--ray {address}: Failed to connect")
    assert "RAY_AUTH_MODE=token" in message and "ray start --head), or" not in message


def test_a_ray_run_measures_no_cpu_by_role(monkeypatch, tmp_path):
    """The actors are the raylet's children, not the driver's: before, their CPU was
    lumped into ``other`` and the servers' roles were empty."""
    from runtime.live_run import _part_metrics
    from runtime.recorder import Recorder

    seen = {}

    async def fake_drive(*args, **kwargs):
        seen.update(kwargs)

    class Group:
        planned, ranks = [], []

        async def start(self):
            pass

        def placements(self):
            return {}

    monkeypatch.setattr(ray_launcher, "drive", fake_drive)
    run = ray_launcher._start_and_drive(
        _spec("live.device=cpu"), RunDir(tmp_path), Group(), Group(), None, None, None
    )
    asyncio.run(run)
    assert seen["host_cpu"] is False
    recorder = Recorder()
    recorder.steps.append({"step": 0, "num_samples": 32, "end_s": 0.5})
    assert _part_metrics(recorder, 0, 0.0, 1.0, {}, {}) == {"time_to_first_step_s": 0.5}


def test_a_server_actor_still_starting_is_killed_at_once(monkeypatch):
    """Before: ``stop`` queued behind the synchronous ``start`` for STOP_TIMEOUT_S (20 s)
    before the kill, so SIGTERM during start-up took ~24 s."""
    import ray

    from runtime.ray_handles import RayServers

    calls = []
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: calls.append(("get", timeout)))
    monkeypatch.setattr(ray, "kill", lambda actor: calls.append(("kill", actor)))

    class Actor:
        class stop:
            remote = staticmethod(lambda: "ref")

    servers = RayServers([0, 1], "token", None, False, 30.0)
    starting = Actor()
    servers.actors = {0: starting, 1: Actor()}
    servers.infos = {1: object()}  # server 1 started; server 0 not yet
    servers.stop(0)
    assert calls == [("kill", starting)]
    servers.stop(1)  # a started one is asked to stop its process group first
    assert calls[1][0] == "get" and calls[2][0] == "kill"


def test_an_address_where_another_service_listens_stops_at_once_naming_it():
    """Seen: ``--ray 127.0.0.1:PORT`` of an HTTP server (a dashboard's port): Ray retried
    'Failed to get cluster ID from GCS server' for minutes. The stand-in for the ray module
    has no ``init``: reaching it would raise ``AttributeError``."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(ValueError) as caught:
            connect(object(), address)  # type: ignore[arg-type]
    finally:
        server.shutdown()
    assert str(caught.value).startswith(f"--ray {address}: something listens there but does "
                                        "not answer as a Ray GCS")  # fmt: skip


def test_a_ray_client_address_given_a_gcs_port_says_to_drop_ray_scheme(monkeypatch):
    """Seen: ``--ray ray://HOST:GCS_PORT`` timed out after 31 s and blamed token
    authentication, on a cluster without it: no Ray Client server listens there."""

    def timing_out(**kwargs):
        raise ConnectionError("ray client connection timeout")

    monkeypatch.setattr(runtime.ray_session, "not_a_gcs", lambda endpoint: None)  # a GCS
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        with pytest.raises(ValueError) as caught:
            connect(types.SimpleNamespace(init=timing_out), f"ray://127.0.0.1:{port}")  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"not a Ray Client server's: give it without ray:// (--ray 127.0.0.1:{port})" in message
    assert "RAY_AUTH_MODE" not in message


def test_a_scale_out_server_ray_cannot_place_is_given_up_on(monkeypatch):
    """Seen: elastic asked for 4 servers on a cluster with no node free for one; its group
    stayed PENDING, and the run never scaled again (the scale-out never ended)."""
    import importlib

    groups = importlib.import_module("ray.util.placement_group")  # ray.util's name is a function
    removed = []

    class PendingGroup:
        bundle_specs = [{"CPU": 1.0}]

        def ready(self):
            return asyncio.get_running_loop().create_future()  # never placed

    fake_ray = types.SimpleNamespace(
        available_resources=lambda: {"CPU": 0.0},
        util=types.SimpleNamespace(remove_placement_group=removed.append),
    )
    monkeypatch.setattr(groups, "placement_group", lambda *args, **kwargs: PendingGroup())
    monkeypatch.setattr(ray_launcher, "PLACEMENT_TIMEOUT_S", 0.05)
    spec = _spec()
    placement = ray_launcher.Placement(fake_ray, plan(spec, gpu=False), label=False)
    with pytest.raises(LiveRunError, match=r"^Ray could not place scale-out server 5 "):
        asyncio.run(placement.server(5))
    assert len(removed) == 1 and placement.extra == {}


def test_a_datacenter_whose_nodes_cannot_hold_its_processes_is_refused_at_once():
    """Seen: 120 s of waiting, then 'could not place ... the cluster has free {'CPU': 3.0,
    'datacenter_dc0': 100.0}', which read as if it fitted: dc0's node had 2 CPUs in all."""
    spec = _spec("cluster.generation.0.num_gpus=3", "cluster.trainer.datacenter=dc1")
    layout = plan(spec, gpu=False)
    nodes = [{"CPU": 2.0, "datacenter_dc0": 100.0}, {"CPU": 2.0, "datacenter_dc1": 100.0}]
    total = {"CPU": 4.0, "datacenter_dc0": 100.0, "datacenter_dc1": 100.0}
    check_fits(spec, layout, total, True)  # the cluster's total holds it
    with pytest.raises(ValueError, match=r"^cluster.generation\[0\] in datacenter dc0 need 3 "
                       r"CPU, the Ray nodes advertising datacenter_dc0 have 2$"):  # fmt: skip
        check_fits(spec, layout, total, True, nodes)
    check_fits(spec, layout, total, True, [{**nodes[0], "CPU": 3.0}, nodes[1]])


def test_a_ray_address_where_nothing_listens_writes_nothing_to_out(tmp_path, capsys):
    """Seen: the refusal came after the run directory held spec.yaml and run.log."""
    from runtime.procs import free_port

    address, out = f"127.0.0.1:{free_port()}", tmp_path / "out"
    assert main(["run", "live-tiny", "--live", "--ray", address, "--out", str(out)]) == 2
    assert f"--ray {address}: no Ray cluster answers there" in capsys.readouterr().out
    assert not out.exists()
