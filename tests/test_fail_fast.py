"""Bad input fails at once, with a message naming it, before any work (issue #16, item 8).

Spec paths are exact; duplicate YAML keys, non-integer counts and huge values are spec
errors naming the key and the limit; run names stay inside runs/; an unusable ``--out``
is refused before the simulation; a simulator-only install asked for the live runtime
says what to install; ``serve`` needs a token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.specs import config_path
from policies.spec import SpecError, load_spec

REPO = Path(__file__).resolve().parents[1]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def no_simulation(monkeypatch):
    """Fail the test if a simulation starts."""
    import sim.simulator

    def refuse(*args, **kwargs):
        raise AssertionError("the simulation started")

    monkeypatch.setattr(sim.simulator.Simulation, "run", refuse)


# -- spec paths (item 6) -----------------------------------------------------------------


def test_a_missing_path_is_an_error_even_when_its_stem_is_a_shipped_name(no_simulation, capsys):
    code = main(["run", "/nonexistent/streamrl-7b.yaml", "--out", "/tmp/tandem-never-written"])
    assert code == 2
    assert "/nonexistent/streamrl-7b.yaml" in _flat(capsys.readouterr().out)
    assert not Path("/tmp/tandem-never-written").exists()


@pytest.mark.parametrize("name", ["streamrl-7b.yaml", "configs/streamrl-7b", "./live-tiny"])
def test_shipped_names_resolve_only_without_separator_or_suffix(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="does not exist"):
        config_path(name)
    assert config_path("streamrl-7b").name == "streamrl-7b.yaml"


def test_a_directory_as_spec_is_a_spec_error(tmp_path, capsys):
    assert main(["run", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "is a directory" in _flat(capsys.readouterr().out)
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)


# -- spec values -------------------------------------------------------------------------


def test_duplicate_yaml_keys_are_refused_naming_the_key_and_lines(tmp_path):
    spec = tmp_path / "dup.yaml"
    spec.write_text("run:\n  iterations: 3\n  seed: 1\n  iterations: 30\n")
    with pytest.raises(SpecError, match=r"duplicate key 'iterations' \(line 4; first on line 2\)"):
        load_spec(spec)
    with pytest.raises(SpecError, match="duplicate key 'a'"):
        load_spec(None, ["cluster.generation=[{a: 1, a: 2}]"])


@pytest.mark.parametrize("value", ["true", "2.0", "'3'"])
def test_counts_must_be_integers(value):
    with pytest.raises(SpecError, match="run.iterations: Input should be a valid integer"):
        load_spec(None, [f"run.iterations={value}"])


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("run.iterations=1000000000", "run.iterations: Input should be less than or equal to 1000000"),
        ("cluster.generation.0.num_gpus=1000000", "num_gpus: Input should be less than or equal to 16384"),
        ("cluster.trainer.num_gpus=1000000", "cluster.trainer.num_gpus: Input should be less than or equal to 16384"),
        ("workload.max_output_tokens=100000000", "less than or equal to 10000000"),
        ("run.iterations=100000", "run.iterations × algorithm.batch_size = 102,400,000 samples; a run may generate at most 10,000,000"),
    ],
)  # fmt: skip
def test_huge_values_fail_at_once_naming_the_limit(override, words, no_simulation):
    with pytest.raises(SpecError) as info:
        load_spec(config_path("streamrl-7b"), [override, "policies.allocation=balanced"])
    assert words in str(info.value)


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", ""])
def test_run_names_stay_inside_runs(name, no_simulation, capsys):
    assert main(["run", "streamrl-7b", "--set", f"run.name={name}"]) == 2
    assert "run.name" in _flat(capsys.readouterr().out)


def test_a_run_name_of_digits_is_a_name():
    """Seen: ``--set run.name=123`` failed with "Input should be a valid string"."""
    assert load_spec(config_path("streamrl-7b"), ["run.name=123"]).run.name == "123"


# -- the output directory ------------------------------------------------------------------


def _bad_outs(tmp_path: Path) -> list[Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return [a_file, a_file / "under", Path("/proc/tandem-read-only")]


@pytest.mark.parametrize("case", [0, 1, 2], ids=["a file", "under a file", "read-only"])
def test_an_unusable_out_fails_before_the_simulation(tmp_path, case, no_simulation, capsys):
    out = _bad_outs(tmp_path)[case]
    assert main(["run", "streamrl-7b", "--out", str(out)]) == 2
    assert f"--out {out}" in _flat(capsys.readouterr().out)


def test_an_unusable_sweep_out_fails_before_any_point(tmp_path, no_simulation, capsys):
    out = _bad_outs(tmp_path)[0]
    code = main(["sweep", "streamrl-7b", "--grid", "run.seed=1,2", "--out", str(out)])
    assert code == 2 and "is a file" in _flat(capsys.readouterr().out)


# -- the live runtime and serve ------------------------------------------------------------

BLOCK_LIVE = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "vllm", "httpx", "fastapi", "transformers"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "args",
    [["run", "live-tiny", "--live"], ["serve", "/tmp", "--token", "t"]],
    ids=["run", "serve"],
)
def test_a_simulator_only_install_asked_for_the_live_runtime_says_what_to_install(tmp_path, args):
    if args[0] == "run":
        args = [*args, "--out", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_LIVE, *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    printed = _flat(done.stdout + done.stderr)
    assert done.returncode == 2, printed
    assert "Traceback" not in printed
    assert "needs the live runtime" in printed and "scripts/setup.sh --live" in printed


def test_a_server_port_already_taken_is_refused_before_anything_starts(tmp_path):
    """Another process listening on the port: the run must not take its /health for ours."""
    import socket

    from runtime.procs import start_server

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            ValueError, match=rf"127.0.0.1:{port} is already in use.*live.base_port"
        ):
            start_server(0, "no-model", "127.0.0.1", port, "t", [0], 1.0, 64, 4, tmp_path)
    assert not list(tmp_path.iterdir())  # no log: nothing was started


def test_server_refuses_an_unknown_executor_by_its_option_name():
    from runtime.guard import GuardPolicy
    from runtime.server import serve_main

    with pytest.raises(ValueError, match=r"--executor 'threads'.*uni, mp"):
        serve_main(str(REPO), policy=GuardPolicy(token="t"), executor="threads")


def test_an_attached_server_that_does_not_answer_is_named_before_the_run_waits_on_it(
    tmp_path, capsys
):
    """Before: the trainer waited 60 s on a weight group the server never joined, then a
    traceback. Now: one line naming the key, the URL and why, in seconds."""
    from runtime.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    overrides = ["--set", f"live.server_urls=[{url}]", "--set", "run.iterations=1"]
    out = tmp_path / "run"
    assert main(["run", "live-tiny", "--live", *overrides, "--out", str(out)]) == 1
    said = _flat(capsys.readouterr().out)
    assert f"live.server_urls[0] {url} does not answer /health (ConnectError" in said
    assert not out.exists()  # before: spec.yaml and run.log, as if a run had started there


def test_a_refused_attach_leaves_nothing_of_a_run_in_an_out_that_was_there(tmp_path, capsys):
    """An --out that was there (empty, or holding a refused run's log) is kept, without a
    spec.yaml of the refused run; the same command then runs as into a fresh directory."""
    from runtime.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    overrides = ["--set", f"live.server_urls=[{url}]", "--set", "run.iterations=1"]
    empty, earlier = tmp_path / "empty", tmp_path / "earlier"
    empty.mkdir()
    earlier.mkdir()
    (earlier / "run.log").write_text("an earlier start's log\n")
    for out in (empty, earlier):
        assert main(["run", "live-tiny", "--live", *overrides, "--out", str(out)]) == 1
    assert "does not answer /health" in _flat(capsys.readouterr().out)
    assert list(empty.iterdir()) == []
    assert [p.name for p in earlier.iterdir()] == ["run.log"]
    assert (earlier / "run.log").read_text().startswith("an earlier start's log\n")


def test_attached_servers_are_checked_for_health_the_token_the_routes_and_the_key():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from runtime.attach import check_attached
    from runtime.errors import LiveRunError
    from runtime.tasks import TaskSet

    class Server(BaseHTTPRequestHandler):  # as tandem serve answers these GETs
        def do_GET(self):  # noqa: N802 - the handler's name is http.server's
            path = self.path
            for prefix in ("/sick", "/plain", "/short", "/other"):
                path = path.removeprefix(prefix)
            body = b""
            if self.path.startswith("/sick"):
                status = 503
            elif path == "/health":
                status = 200
            elif path == "/v1/models":  # an inference route: the API key; the context
                status = 200 if self.headers.get("Authorization") == "Bearer key" else 401
                context = 64 if self.path.startswith("/short") else 512
                body = json.dumps({"data": [{"id": "m", "max_model_len": context}]}).encode()
            elif path == "/v1/tandem/params":  # the served model's names and shapes
                status, shapes = 200, [["embed", [64, 8]], ["head", [8, 64]]]
                if self.path.startswith("/other"):
                    shapes.append(["layers.1", [8, 8]])
                body = json.dumps({"params": shapes}).encode()
            elif self.path.startswith("/plain"):
                status = 404  # a server without tandem's routes
            elif self.headers.get("Authorization") != "Bearer right":
                status = 403
            else:
                status = 405  # /init_process_group is a POST route
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Server) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        check_attached([url, url + "/"], "right", api_key="key")
        with pytest.raises(
            LiveRunError, match=r"server_urls\[0\] .* refused the run's API key \(401"
        ):
            check_attached([url], "right", api_key=None)
        with pytest.raises(LiveRunError, match=r"server_urls\[1\] .*/sick does not answer.*503"):
            check_attached([url, url + "/sick"], "right", api_key="key")
        with pytest.raises(
            LiveRunError, match=r"server_urls\[0\] .* refused the run's token \(403"
        ):
            check_attached([url], "wrong", api_key="key")
        with pytest.raises(LiveRunError, match=r"refused the run, which was given no token \(403"):
            check_attached([url], None, api_key="key")
        with pytest.raises(LiveRunError, match=r"server_urls\[0\] .*/plain has no /init_process"):
            check_attached([url + "/plain"], "right", api_key="key")
        tasks = TaskSet(0, 64, 128)  # prompts up to ~40 tokens: 512 holds them, 64 does not
        check_attached([url], "right", api_key="key", tasks=tasks)
        with pytest.raises(
            LiveRunError, match=r"server_urls\[1\] .*/short's max_model_len \(64\) is shorter"
        ):
            check_attached([url, url + "/short"], "right", api_key="key", tasks=tasks)
        # before: a trainer on another model than the served one trained on, exit 0
        params = {"embed": (64, 8), "head": (8, 64)}
        check_attached([url], "right", api_key="key", params=params)
        with pytest.raises(
            LiveRunError, match=r"server_urls\[1\] .*/other serves another model than "
            r"model.path \(2 parameters against 3; 'layers.1' only in the served model\)",
        ):  # fmt: skip
            check_attached([url, url + "/other"], "right", api_key="key", params=params)
        with pytest.raises(LiveRunError, match=r"'head' is \[8, 32\] against \[8, 64\] served"):
            check_attached([url], "right", api_key="key", params={**params, "head": (8, 32)})
        server.shutdown()


def test_a_context_shorter_than_prompt_and_answer_is_refused_before_anything_starts(
    tmp_path, capsys
):
    """Before: vLLM ended the long answers at the context length (a 106-token answer cut
    to 58 at max_model_len 64) and the run trained on them, rewards and all, exit 0."""
    overrides = ["--set", "live.max_model_len=64", "--set", "run.iterations=1"]
    out = tmp_path / "run"
    assert main(["run", "live-tiny", "--live", *overrides, "--out", str(out)]) == 2  # a spec error
    said = _flat(capsys.readouterr().out)
    assert "live.max_model_len (64) is shorter than the longest prompt" in said
    assert "at least 170" in said
    assert not out.exists()  # no server, no results, no run directory


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sweep", "streamrl-7b", "--grid", "run.seed=1,2", "--workers", "0"],
         "argument --workers: expected an integer >= 1, got 0"),
        (["sweep", "streamrl-7b", "--grid", "run.seed=1,2", "--point-timeout", "-1"],
         "argument --point-timeout: expected a number > 0, got -1"),
        (["advise", "streamrl-7b", "--budget-s", "0"], "argument --budget-s: expected a number > 0"),
        (["bench", "peers", "--rounds", "two"], "argument --rounds: expected an integer >= 1, got 'two'"),
        (["bench", "peers", "--max-other-load", "1.5"], "expected a number >= 0 and <= 1, got 1.5"),
        (["reproduce", "streamrl", "--workers", "-2"], "argument --workers: expected an integer >= 1"),
        (["serve", "/tmp", "--port", "0"], "argument --port: expected an integer >= 1 and <= 65535"),
    ],
)  # fmt: skip
def test_a_count_or_time_out_of_range_is_refused_by_the_parser_naming_the_option(
    tmp_path, capsys, no_simulation, args, says
):
    """Before: --workers 0 ran with the default, --point-timeout -1 failed every point."""
    with pytest.raises(SystemExit) as stop:
        main([*args, "--out", str(tmp_path / "out")] if args[0] != "serve" else args)
    assert stop.value.code == 2
    assert says in _flat(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_a_port_taken_by_another_server_while_ours_starts_is_named_not_taken_for_ours(tmp_path):
    """Two runs on one live.base_port: the second's check passed while the first's server
    was still starting. Its /health then answered from the first's server, and the run
    failed on the token after a 60 s wait."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from runtime.procs import ServerProcess, wait_healthy

    class Other(BaseHTTPRequestHandler):  # another run's tandem server on the port
        def do_GET(self):  # noqa: N802 - the handler's name is http.server's
            body = json.dumps({"status": "ok", "pid": 4242}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ThreadingHTTPServer(("127.0.0.1", 0), Other) as other:
            threading.Thread(target=other.serve_forever, daemon=True).start()
            url = f"http://127.0.0.1:{other.server_address[1]}"
            server = ServerProcess(0, url, ours, tmp_path / "server-0.log")
            with pytest.raises(ValueError, match=r"served by another process \(pid 4242\)"):
                wait_healthy(server, timeout_s=10)
            other.shutdown()
    finally:
        ours.kill()
        ours.wait()


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("algorithm.group_size=1", "algorithm.group_size 1: the live loss's advantage"),
        ("live.temperature=0", "live.temperature 0: greedy sampling gives every sample"),
        ("model.path=/no/such/model", "model.path /no/such/model does not exist"),
        (f"model.path={REPO / 'README.md'}", "README.md is a file, not a model directory"),
        ("pipeline.mode=pipeline --set pipeline.inflight=abort-resubmit",
         "'abort-resubmit' is not implemented live"),
    ],
)  # fmt: skip
def test_a_live_run_that_would_learn_nothing_or_fail_late_is_refused_naming_the_key(
    override, says, tmp_path, capsys
):
    """Before: ``streamrl-7b --live`` (ppo, groups of one), or ``live-tiny`` at temperature
    0, ran to the end with every advantage 0: every sample skipped, loss 0, weights
    unchanged, exit 0; a model path that is not a model failed after the servers started,
    with a traceback of ``Repo id must be in the form …``."""
    out = tmp_path / "run"
    sets = [arg for key in override.split(" --set ") for arg in ("--set", key)]
    args = ["run", "live-tiny", "--live", *sets, "--out", str(out)]
    assert main(args) == 2
    assert says in _flat(capsys.readouterr().out)
    assert not out.exists()  # refused before anything starts: not even its run.log
