"""The Ray backend (evolver.evaluation.backends.ray) on a real local Ray instance: scripted LLMs; tau2, git,
the sandbox, Ray and subprocesses are real.

`evolver eval` and `evolver run` give the local backend's results for the same seeds; provider
keys reach the workers on the nodes and never the agent; a resumed evaluation keeps what it has;
two evaluations run at once; a killed Ray worker's simulations are run again; cancel() and
Ctrl-C stop everything; and no Ray or evolver process outlives the instance evolver started.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evolver.config_load import load_config
from evolver.config_requests import eval_request
from evolver.data import SimRecord
from evolver.errors import UsageError
from evolver.evaluation.backends import Cancelled
from evolver.evaluation.backends.ray import RayBackend, plan, worker_environment
from evolver.evaluation.backends.ray_node import pack_agent, unpack_agent
from evolver.store.evaldir import EvalDir
from tests.conftest import LINEAGE, SCRIPTED_MODELS, git, run_cli
from tests.scripts.ray_cases import KEY, VALUE
from tests.test_eval import _inject_into_turn
from tests.test_loop import tiny_target

EVAL_ARGS = ["--json", *SCRIPTED_MODELS, "--trials", "2", "--concurrency", "4", "--seed", "11"]  # all 9 mock tasks
KEY_ENV = {"EVOLVER_SCRIPT": "tests.scripts.ray_cases:needs_key", KEY: VALUE}
LOOP_ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"}
# The one-shot proposer, as in tests/test_loop.py: the scripted verdicts of broken patches reach the loop unfiltered.
RUN_ARGS = [
    "--iterations",
    "4",
    "--gate-stages",
    "1",
    "--no-holdout",
    "--concurrency",
    "8",
    "--proposer",
    "oneshot",
    *LINEAGE,
    *SCRIPTED_MODELS,
]
# The candidate refuses to work if its process can see a key: the sandbox gives it an empty environment.
NO_KEYS_IN_THE_AGENT = (
    "import os\n"
    "if [k for k in os.environ if k.endswith('_API_KEY')]:\n"
    "    raise RuntimeError('the agent process sees keys: ' + ', '.join(k for k in os.environ if k.endswith('_API_KEY')))"
)


def mock_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "test@example.invalid")
    git(path, "config", "user.name", "test")
    assert run_cli(["init", str(path)]).returncode == 0
    git(path, "add", "-A")
    git(path, "commit", "-qm", "init")
    return path


def processes_with(marker: str) -> dict[int, str]:
    """Processes whose command line or open files name ``marker``, by pid (with their command lines). Given
    a Ray instance's own folder (a command's TMPDIR, a cluster's root), that is its daemons (their --temp-dir
    or --session-dir), its workers, which rename themselves (ray::IDLE, ray::run_group: their command line and
    environment are overwritten) but keep their logs open in the instance's session folder, and the worker
    daemon of an instance evolver started (its socket), with that daemon's forks. Nothing else: other runs
    of these tests may share the machine."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            files = [os.readlink(fd) for fd in (entry / "fd").iterdir()] if marker not in cmd else []
        except OSError:
            continue
        if marker in cmd or any(marker in f for f in files):
            found[int(entry.name)] = cmd.strip()
    return found


def test_the_leftover_check_sees_a_worker_that_renamed_itself(tmp_path):
    """A process renamed as Ray renames its workers (setproctitle), its log open in the instance's folder: found."""
    script = (
        "import sys, time, ray._raylet as r; log = open(sys.argv[1], 'a'); r.setproctitle('ray::IDLE'); print(flush=True); time.sleep(120)"
    )
    worker = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "worker.out")], stdout=subprocess.PIPE, text=True)
    try:
        worker.stdout.readline()  # renamed
        assert processes_with(str(tmp_path)) == {worker.pid: "ray::IDLE"}
    finally:
        worker.kill()
        worker.wait()
    assert left_behind(str(tmp_path), wait=5) == []


def left_behind(marker: str, wait: float = 20.0) -> list[str]:
    """Such processes still there ``wait`` seconds on."""
    deadline = time.monotonic() + wait
    while True:
        found = sorted(cmd[:150] for cmd in processes_with(marker).values())
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def own_tmpdir() -> str:
    """A TMPDIR for one command, so that its Ray instance's folder (made there) names its processes.
    Short: Ray's socket paths below it must fit in 107 bytes."""
    return tempfile.mkdtemp(prefix="e", dir="/tmp")


# Ray commands run as they are, not in a fork of the tests' warm daemon, so that TMPDIR applies to them.
ALONE = {"EVOLVER_ZYGOTE_IDLE": "0"}


def at_once(calls: dict) -> dict:
    """Each of ``calls`` (name: function) in a thread of its own, all at the same time; their results by name. For
    commands that compare two backends: neither waits for the other (a Ray instance spends seconds starting)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
        return {name: future.result() for name, future in futures.items()}


def per_simulation(result_file: str) -> dict:
    sims = json.loads(Path(result_file).read_text())["simulations"]
    return {(s["task_id"], s["trial"]): (s["seed"], s["outcome"], s["reward"], s["termination_reason"]) for s in sims}


def test_the_concurrency_is_shared_out_and_every_task_lands_in_one_group():
    tasks = [f"t{i}" for i in range(10)]
    for concurrency, cpus, n in ((1, 64, 1), (4, 64, 1), (5, 64, 2), (16, 64, 4), (64, 64, 10), (16, 2, 1), (16, 5, 2)):
        groups, shares = plan(tasks, concurrency, cpus)
        assert len(groups) == len(shares) == n and sum(shares) == concurrency and max(shares) - min(shares) <= 1
        assert sorted(t for g in groups for t in g) == tasks
    assert plan(["only"], 16, 64) == ([["only"]], [16])  # one task keeps all its trials and the whole concurrency


def test_the_candidate_travels_as_its_agent_folder(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "agent" / "skills" / "__pycache__").mkdir(parents=True)
    (checkout / "agent" / "agent.py").write_text("AGENT = 1\n")
    (checkout / "agent" / "skills" / "a.md").write_text("skill")
    (checkout / "agent" / "skills" / "__pycache__" / "x.pyc").write_bytes(b"stale")
    (checkout / "agent" / "same.md").symlink_to("skills/a.md")
    (checkout / "evolver.toml").write_text("not sent")
    unpack_agent(pack_agent(checkout), tmp_path / "node")
    got = sorted(str(p.relative_to(tmp_path / "node")) for p in (tmp_path / "node").rglob("*"))
    assert got == ["agent", "agent/agent.py", "agent/same.md", "agent/skills", "agent/skills/a.md"]
    assert os.readlink(tmp_path / "node" / "agent" / "same.md") == "skills/a.md"  # a link stays a link
    (checkout / "agent" / "out.md").symlink_to("../evolver.toml")
    with pytest.raises(UsageError, match="links outside agent/"):
        pack_agent(checkout)


def test_the_workers_get_the_environment_less_what_describes_this_machine():
    sent = worker_environment(
        {
            "OPENAI_API_KEY": "k",
            "EVOLVER_SCRIPT": "s",
            "PYTHONPATH": "p",
            "AWS_REGION_NAME": "r",
            "PATH": "/bin",
            "HOME": "/root",
            "RAY_ADDRESS": "a",
            "EVOLVER_RUNTIME_DIR": "d",
            "XDG_RUNTIME_DIR": "x",
        }
    )
    assert sent == {"OPENAI_API_KEY": "k", "EVOLVER_SCRIPT": "s", "PYTHONPATH": "p", "AWS_REGION_NAME": "r"}


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1:1", "cannot reach a Ray cluster at '127.0.0.1:1'"),
        ("nonsense", "--ray-address 'nonsense' is neither HOST:PORT of a Ray head node nor auto"),
    ],
)
def test_a_bad_ray_address_is_refused_in_one_line_at_once(repo, address, message):
    started = time.monotonic()
    proc = run_cli(["eval", str(repo), "--backend", "ray", "--ray-address", address, *SCRIPTED_MODELS])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"evolver: error: {message}"), proc.stderr
    assert time.monotonic() - started < 30 and not list((repo / "runs").glob("eval-*"))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same evaluation through each backend: keyed provider, a candidate that checks it holds no key."""
    repo = mock_repo(tmp_path_factory.mktemp("ray-eval") / "target")
    _inject_into_turn(repo, NO_KEYS_IN_THE_AGENT)
    tmpdir, out = own_tmpdir(), {}
    envs = {"local": KEY_ENV, "ray": {**KEY_ENV, **ALONE, "TMPDIR": tmpdir}}
    procs = at_once(
        {backend: (lambda b=backend: run_cli(["eval", str(repo), "--backend", b, *EVAL_ARGS], env=envs[b])) for backend in envs}
    )
    for backend, proc in procs.items():
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[backend] = json.loads(proc.stdout)
    left = left_behind(tmpdir)
    shutil.rmtree(tmpdir, ignore_errors=True)
    return repo, out, left


def test_eval_on_ray_gives_the_local_results_for_the_same_seed(both):
    _, out, _ = both
    local, ray = per_simulation(out["local"]["result_file"]), per_simulation(out["ray"]["result_file"])
    assert len(ray) == 18 and ray == local  # task, trial, seed, outcome, reward and termination, one by one
    assert {reward for _, _, reward, _ in ray.values()} == {0.0, 1.0}  # tasks that pass and a task that fails
    assert out["ray"]["usage"] == out["local"]["usage"]
    result = json.loads(Path(out["ray"]["result_file"]).read_text())
    assert result["isolation"]["mode"] == json.loads(Path(out["local"]["result_file"]).read_text())["isolation"]["mode"] == "sandbox"
    run_dir = Path(out["ray"]["result_file"]).parent
    keys = [(r.task_id, r.trial) for r in map(SimRecord.model_validate_json, (run_dir / "sims.jsonl").read_text().splitlines())]
    assert sorted(keys) == sorted(ray)  # the driver wrote each simulation once
    local_dir = Path(out["local"]["result_file"]).parent
    for sim in result["simulations"]:
        trajectory = json.loads((run_dir / sim["trajectory_file"]).read_text())
        assert trajectory["task_id"] == sim["task_id"] and trajectory["messages"]
        # the model's view of each turn comes back from the node with its trajectory, as the local worker records it
        assert (run_dir / sim["turns_file"]).read_bytes() == (local_dir / sim["turns_file"]).read_bytes()


def test_keys_reach_the_workers_on_the_nodes_and_never_the_agent(both):
    repo, out, _ = both
    for summary in out.values():  # without the key every call fails; with a key in sight the candidate fails
        assert summary["infra_errors"] == 0 and summary["failed"] == 0
    written = [p for p in (repo / "runs").rglob("*") if p.is_file() and VALUE in p.read_text(errors="replace")]
    assert written == []


def test_no_ray_or_evolver_process_outlives_the_command(both):
    assert both[2] == []


@pytest.fixture
def cluster(tmp_path_factory):
    """A Ray cluster started with `ray start`, without the keys or this checkout on its PYTHONPATH:
    what a job brings must come from the driver. Its own token; stopped by pid, not with `ray stop`
    (which stops every Ray instance on the machine)."""
    root = Path(tempfile.mkdtemp(prefix="evolver-ray-cluster-"))  # short: Ray's socket paths must fit 107 bytes
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "PYTHONPATH"}
    env.update(auth, RAY_USAGE_STATS_ENABLED="0", EVOLVER_RUNTIME_DIR=str(root / "zygote"))
    start = subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--object-store-memory",
            "100000000",
            "--include-dashboard",
            "false",
            "--temp-dir",
            str(root / "ray"),
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert start.returncode == 0, start.stderr[-2000:]
        yield f"127.0.0.1:{port}", auth, root
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            daemons = processes_with(str(root))
            for pid in set(daemons).union(*(descendants(pid) for pid in daemons)):  # its Ray workers too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if not left_behind(str(root), wait=10):
                break
        shutil.rmtree(root, ignore_errors=True)


def test_joining_a_cluster_its_workers_get_the_keys_and_this_checkout_from_the_driver(cluster, tmp_path):
    address, auth, root = cluster
    repo = mock_repo(tmp_path / "target")
    _inject_into_turn(repo, NO_KEYS_IN_THE_AGENT)
    env = {**KEY_ENV, **auth, "EVOLVER_ZYGOTE_IDLE": "1"}  # the node's daemon goes 1 s after the job's Ray workers
    proc = run_cli(
        ["eval", str(repo), "--backend", "ray", "--ray-address", address, *EVAL_ARGS, "--task-ids", "create_task_1,update_task_1"], env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["num_simulations"] == 4 and summary["avg_reward"] == 1.0 and summary["infra_errors"] == summary["failed"] == 0
    # The job is over: only the cluster's own processes are left, not its Ray workers' daemon and their forks.
    assert left_behind(str(root / "zygote"), wait=10) == []
    logged = subprocess.run(["grep", "-rl", VALUE, str(root)], capture_output=True, text=True).stdout
    assert logged == ""  # the key is in none of the cluster's logs and files


@pytest.mark.slow
def test_run_on_ray_reaches_the_local_verdicts(tmp_path):
    def end_of_run(backend: str) -> dict:
        repo = tiny_target(tmp_path / backend)  # 3 analysis and 6 gate tasks: the four verdicts of the 40-task grid
        proc = run_cli(["run", str(repo), "--backend", backend, *RUN_ARGS], env=LOOP_ENV)
        assert proc.returncode == 0, proc.stderr[-3000:]
        [run_id] = [p.name for p in (repo / "runs").glob("run-*")]
        history = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"]
        status = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)
        return {
            "candidates": [(c["title"], c["verdict"], c["gate_candidate"], c["gate_incumbent"]) for c in history],
            "best": git(repo, "rev-parse", f"evolver/{run_id}/best^{{tree}}").strip(),
            "usage": status["usage"],
        }

    ends = at_once({backend: (lambda b=backend: end_of_run(b)) for backend in ("local", "ray")})
    assert [(t, v) for t, v, _, _ in ends["ray"]["candidates"]] == [
        ("Break the state class", "invalid"),
        ("Edit the optimizer", "refused"),
        ("Transfer everyone", "rejected"),
        ("Keep the user's exact title", "accepted"),
    ]
    assert ends["ray"] == ends["local"]  # gate scores, the kept tree and every token included


def test_ctrl_c_stops_a_ray_evaluation_and_everything_it_started(tmp_path):
    repo = mock_repo(tmp_path / "target")
    tmpdir = own_tmpdir()
    command = [sys.executable, "-m", "evolver", "eval", str(repo), "--backend", "ray", *SCRIPTED_MODELS, "--trials", "4"]
    proc = subprocess.Popen(
        command,
        env={**os.environ, **ALONE, "TMPDIR": tmpdir, "EVOLVER_SCRIPTED_LATENCY": "0.3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, sims = time.monotonic() + 300, None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((repo / "runs").glob("eval-*/sims.jsonl"))
        if found and found[0].read_text().count("\n") >= 2:
            sims = found[0]
            break
        time.sleep(0.1)
    assert sims is not None and proc.poll() is None, "the evaluation ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    count = sims.read_text().count("\n")
    assert count < 36  # stopped mid-way (9 tasks x 4 trials)
    assert left_behind(tmpdir) == []
    assert sims.read_text().count("\n") == count
    shutil.rmtree(tmpdir, ignore_errors=True)


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


@pytest.fixture(scope="class")
def backend(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVOLVER_SCRIPTED_LATENCY", "0.2")  # reaches the workers: the backend takes the environment it starts with
        mp.setenv("EVOLVER_SCRIPTED_HOLD", str(tmp_path_factory.mktemp("hold")))  # inert until a test puts `held` there
        with RayBackend("") as backend:
            yield backend
    assert not backend.root.exists() and left_behind(str(backend.root)) == []
    from evolver import ratelimit
    from evolver.evaluation.backends.ray_limits import RemoteLimiter

    # the cluster's limiter leaves with the cluster: a later call of this process (the next test's meta-LLM) must not ask it
    assert not isinstance(ratelimit.current(), RemoteLimiter)


@pytest.fixture(scope="class")
def inproc_repo(tmp_path_factory):
    return mock_repo(tmp_path_factory.mktemp("ray-inproc") / "target")


@pytest.mark.usefixtures("backend")
class TestInProcess:
    """A RayBackend in this process: resuming, concurrency, a killed Ray worker, cancel()."""

    @pytest.fixture
    def repo(self, inproc_repo):
        return inproc_repo

    def request(self, repo: Path, out: Path, tasks: list[str], trials: int = 2):
        cfg = load_config(repo, {"agent_model": "scripted/agent", "user_model": "scripted/user", "judge_model": "scripted/judge"})
        return eval_request(cfg, repo, out, local_api_base=None, task_ids=tasks, trials=trials, concurrency=4, seed=5)

    def zygote_processes(self, backend, wait: float = 10.0) -> int:
        """The instance's zygote and its forks (workers, agent processes: they share its command line),
        once only the zygote is left or ``wait`` seconds have passed."""
        deadline = time.monotonic() + wait
        while True:
            count = sum("evolver.evaluation.zygote" in cmd for cmd in processes_with(str(backend.root)).values())
            if count <= 1 or time.monotonic() > deadline:
                return count
            time.sleep(0.1)

    def test_a_resumed_evaluation_keeps_scored_simulations_and_retries_infrastructure_errors(self, backend, repo, tmp_path):
        out = tmp_path / "eval"
        out.mkdir()
        earlier = [
            SimRecord(task_id="create_task_1", trial=0, outcome="ok", reward=0.25),  # a reward no run gives: kept, not rerun
            SimRecord(task_id="update_task_1", trial=0, outcome="infra_error", termination_reason="infra_error", error="outage"),
        ]
        (out / "sims.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in earlier))
        result = backend.evaluate(self.request(repo, out, ["create_task_1", "update_task_1"], trials=1), "resume", timeout=300)
        assert {(s.task_id, s.outcome, s.reward) for s in result.simulations} == {
            ("create_task_1", "ok", 0.25),
            ("update_task_1", "ok", 1.0),
        }
        assert result.worker_note is None
        lines = [SimRecord.model_validate_json(line) for line in (out / "sims.jsonl").read_text().splitlines()]
        assert [(r.task_id, r.outcome) for r in lines] == [
            ("create_task_1", "ok"),
            ("update_task_1", "infra_error"),
            ("update_task_1", "ok"),
        ]

    def test_two_evaluations_at_once(self, backend, repo, tmp_path):
        tasks = ["create_task_1", "update_task_1", "impossible_task_1"]
        results = {}

        def evaluate(name: str) -> None:
            results[name] = backend.evaluate(self.request(repo, tmp_path / name, tasks, trials=4), name, timeout=300)

        # Every model call waits while `held` is there: each evaluation runs at most 4 simulations at once, so more
        # than 4 calls waiting together means both were under way, however long a Ray worker took to start.
        hold = Path(os.environ["EVOLVER_SCRIPTED_HOLD"])
        (hold / "held").touch()
        threads = [threading.Thread(target=evaluate, args=(name,)) for name in ("a", "b")]
        try:
            for t in threads:
                t.start()
            deadline, waiting = time.monotonic() + 120, 0
            while time.monotonic() < deadline and waiting <= 4:
                waiting = max(waiting, len(list(hold.glob("call-*"))))
                time.sleep(0.05)
        finally:
            (hold / "held").unlink()
        for t in threads:
            t.join(300)
        assert waiting > 4, f"at most {waiting} calls were under way at once: one evaluation waited for the other"
        assert set(results) == {"a", "b"}
        for result in results.values():
            assert [(s.task_id, s.trial, s.outcome, s.reward) for s in result.simulations] == [
                (t, trial, "ok", 1.0) for trial in range(4) for t in tasks
            ]
            assert len((tmp_path / result.run_id / "sims.jsonl").read_text().splitlines()) == 12
        assert list(hold.glob("call-*")) == []

    def test_a_killed_ray_worker_is_an_infrastructure_fault_and_its_simulations_run_again(self, backend, repo, tmp_path):
        out = tmp_path / "killed"
        tasks = ["create_task_1", "update_task_1"]  # 8 simulations at 4 at once: a second wave follows the first record
        done = {}
        runner = threading.Thread(
            target=lambda: done.update(result=backend.evaluate(self.request(repo, out, tasks, trials=4), "killed", timeout=300))
        )
        runner.start()
        deadline, victim = time.monotonic() + 120, None
        while time.monotonic() < deadline and victim is None:
            if (out / "sims.jsonl").exists() and (out / "sims.jsonl").read_text():  # groups are mid-way
                mine = descendants(os.getpid())
                victim = next((pid for pid, cmd in processes_with("ray::run_group").items() if pid in mine), None)
            time.sleep(0.05)
        assert victim is not None, "no Ray task was seen running a group"
        os.kill(victim, signal.SIGKILL)
        runner.join(300)
        result = done["result"]
        assert [(s.task_id, s.trial, s.outcome, s.reward) for s in result.simulations] == [
            (t, trial, "ok", 1.0) for trial in range(4) for t in tasks
        ]
        assert result.worker_note is None and result.summary.infra_errors == 0
        assert "ended early (attempt 1 of 3): WorkerCrashedError" in (out / "worker.log").read_text()
        records = EvalDir(out).records()
        assert len((out / "sims.jsonl").read_text().splitlines()) == len(records) == 8  # nothing ran twice
        assert self.zygote_processes(backend) == 1  # the killed Ray worker's workers and agent processes went with it

    def test_cancel_stops_every_evaluation_in_flight_and_their_workers(self, backend, repo, tmp_path):
        errors = {}

        def evaluate(name: str) -> None:
            try:
                # 40 simulations each: both are still running once each has a record, even if one waited for a Ray worker to start
                backend.evaluate(self.request(repo, tmp_path / name, ["create_task_1", "update_task_1"], trials=20), name, timeout=300)
            except Cancelled as exc:
                errors[name] = exc

        threads = [threading.Thread(target=evaluate, args=(name,)) for name in ("a", "b")]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all((tmp_path / n / "sims.jsonl").exists() for n in ("a", "b")):
            time.sleep(0.05)
        backend.cancel()
        for t in threads:
            t.join(60)
        assert set(errors) == {"a", "b"}
        counts = [len((tmp_path / n / "sims.jsonl").read_text().splitlines()) for n in ("a", "b")]
        assert max(counts) < 40
        assert self.zygote_processes(backend) == 1  # the warm zygote stays; no worker or agent process is left
        later = backend.evaluate(self.request(repo, tmp_path / "later", ["create_task_1"], trials=1), "later", timeout=300)
        assert later.simulations[0].reward == 1.0  # cancel() stopped what was in flight, not the backend

    def test_one_rate_limit_for_the_cluster_and_a_lost_limiter_costs_nothing(self, backend, repo, tmp_path, capsys):
        """Every group's workers take their turn in the cluster's limiter (a Ray actor): against a provider
        that allows 600 calls a minute, 64 simulations with 24 at once lose nothing and meet few 429s. Then the
        actor is killed mid-evaluation: every node goes on with its share, says so once, and loses nothing."""
        import ray

        from evolver import ratelimit
        from evolver.evaluation.backends import ray as ray_backend
        from evolver.evaluation.backends.ray_limits import RemoteLimiter
        from tests.scripts.fake_openai import FakeOpenAI, Limit
        from tests.test_rate_limits import SHORT, TASKS, assert_learnt

        def request(fake, out, trials=16):
            roles = {f"{r}_model": "openai/shared" for r in ("agent", "user", "judge")}
            roles.update({f"{r}_args": [f'extra_body={{fake_role = "{r}"}}'] for r in ("agent", "user", "judge")})
            cfg = load_config(repo, {**roles, "api_base": fake.api_base})
            return eval_request(cfg, repo, out, local_api_base=None, task_ids=TASKS, trials=trials, concurrency=24, seed=5)

        with FakeOpenAI(limit=Limit(**SHORT)) as fake:
            result = backend.evaluate(request(fake, tmp_path / "shared"), "shared", timeout=600)
            [(lane, tally)] = result.summary.rate_limits.items()
            assert result.summary.infra_errors == 0 and result.summary.scored == 64
            assert tally.limited == sum(fake.limited.values()) and tally.calls == sum(fake.requests.values()) >= 250
            assert_learnt(fake)
            assert ray.get(backend.actor.snapshot.remote())[lane]["calls"] == tally.calls  # the one limiter saw them all

        with FakeOpenAI(limit=Limit(**SHORT)) as fake:
            out, done = tmp_path / "lost", {}
            runner = threading.Thread(
                target=lambda: done.update(result=backend.evaluate(request(fake, out, trials=8), "lost", timeout=600))
            )
            runner.start()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not ((out / "sims.jsonl").exists() and (out / "sims.jsonl").read_text().count("\n") >= 8):
                time.sleep(0.05)
            ray.kill(backend.actor)
            runner.join(600)
            try:
                result = done["result"]
                assert result.summary.infra_errors == 0 and result.summary.scored == 32 and result.worker_note is None
                log = (out / "worker.log").read_text()
                assert log.count("the cluster's rate limiter was lost") == 1, log  # one group: said once
                assert "this process goes on with 1/1 of the limits on its own" in log
                assert capsys.readouterr().err.count("the cluster's rate limiter was lost") == 1
            finally:  # the class's later tests get a limiter again
                backend.actor = ray_backend._limiter_actor(ray, {})
                ratelimit.install(RemoteLimiter(backend.actor, {}, say=backend.say))
