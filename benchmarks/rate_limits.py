"""Holding a provider's rate limit: `evolver eval` and `evolver run --candidates 4` against a rate-limited fake provider.

    python benchmarks/rate_limits.py [--rpm 600] [--latency 0.3] [--demand 8] [--sims 48] [--backends local,ray]
                                     [--limiter learnt,headers,configured,off] [--kinds eval,run] [--controllers]

The provider (tests/scripts/fake_openai.py with a Limit) is an OpenAI-compatible server on
127.0.0.1 with a token bucket per model (--rpm requests per minute, --tpm tokens; 429 with
Retry-After when over, x-ratelimit-* headers when the limiter mode is "headers"), a fixed latency
per call, and optional shares of 500s and slow answers. The agent, user and judge models are
scripted through it; all three roles share ONE model name, so every call counts against one limit,
as a user running every role on gpt-4.1-mini has it. --concurrency is chosen so that the calls asked
for are --demand times what the limit allows (concurrency x 1/latency against rpm/60).

For each backend (local; ray: a local Ray instance started with 4 CPUs, on which the Ray backend runs two
groups of two worker processes: 4 workers) and each limiter mode:
  learnt      no limit configured, no headers: learnt from 429s and Retry-After alone
  headers     the provider declares its limit in x-ratelimit-limit-* headers, as OpenAI does
  configured  rate_limits given on the command line (--rate-limit MODEL=RPM/TPM)
  off         EVOLVER_RATE_LIMITER=off: every call on its own with backoff, what evolver did before
it prints simulations completed and lost, infrastructure errors, 429s received (and their share
of calls, over the whole evaluation and after the first 20 s, once the limiter has learnt),
achieved requests per minute (answered calls over the time calls were made) against the limit,
and the wall clock against the ideal (total answered calls / limit).

--kinds run measures `evolver run --iterations 1 --candidates 4` instead (or as well): the loop's target
agent, a scripted meta model proposing four distinct candidates, the same provider; the same columns over
all of the run's evaluations (its meta-LLM's calls counted with the rest).

--controllers compares learning rules in virtual time (no processes): the same token-bucket provider
and a closed loop of callers, evolver's Limiter on a virtual clock with each rule: additive increase (which
needs to know the limit's size: an upper bound on what it can do), multiplicative growth with a cut of
the rate, or a cut to a share of the throughput measured over the last 10 s; at two bucket sizes, with
and without Retry-After, with steady demand and with demand stopping every other 30 s (as a run's does between
evaluations). Achieved rate / limit (over the seconds calls were asked for) and the share of 429s after the first minute, and the
share of 429s over the whole 600 s (the first minute's learning included).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "shared"  # the one model name every role uses: one lane, one limit
TASKS = [
    "create_task_1",
    "create_task_1_with_env_assertions",
    "update_task_1",
    "update_task_with_message_history",
    "update_task_with_initialization_data",
    "update_task_with_initialization_actions",
    "update_task_with_history_and_env_assertions",
    "impossible_task_1",
]
LEARNT_AFTER = 20.0  # seconds: 429s after this count as "once learnt"


# ---- the learning rules in virtual time -------------------------------------------------------


class AIMD:
    """Plain additive increase, multiplicative decrease, for comparison: halve the rate on a 429 (once
    per hold), add ``step`` requests per second every second without one."""

    def __init__(self, step: float, hold: float = 2.0):
        self.rate, self.step, self.hold, self.cut_at, self.grown_at, self.pressed = None, step, hold, -1e9, 0.0, False

    def limited(self, now: float, through: float) -> bool:
        if now - self.cut_at < self.hold:
            return False
        self.rate = max(1 / 60, (self.rate if self.rate is not None else through) * 0.5)
        self.cut_at = self.grown_at = now
        return True

    def answered(self, now: float, pressed: bool = True) -> None:
        if self.rate is not None and now - self.cut_at >= self.hold and pressed and self.pressed:
            self.rate += self.step * (now - self.grown_at)
        self.grown_at, self.pressed = now, pressed


QUIET = 30.0  # seconds: with quiet=True, demand stops for this long after every QUIET seconds of calls


def simulate(
    learner, rpm: float, burst: float, latency: float, demand: float, seconds: float, retry_after: bool = True, quiet: bool = False
) -> dict:
    """Callers in a closed loop (each: permit, call, next) against a token bucket of ``rpm`` holding
    ``burst`` seconds of it; evolver's Limiter with ``learner`` on a virtual clock, asked and told as
    evolver.llm does. ``quiet``: the callers stop every other QUIET seconds, as a run's calls do between
    evaluations."""
    from evolver.ratelimit.answers import Answer
    from evolver.ratelimit.lanes import Limiter

    rate = rpm / 60
    callers = max(1, round(demand * rate * latency))
    now = 0.0
    limiter = Limiter(learner=lambda: learner, clock=lambda: now)
    capacity, level, filled = max(1.0, rate * burst), max(1.0, rate * burst), 0.0
    queue: list[tuple] = []  # the tickets of callers waiting for their turn, first come first served
    events = [(0.0, "ask")] * callers
    heapq.heapify(events)
    answered, limited, limited_late, answered_late = 0, 0, 0, 0
    tick_at = -1.0

    def send() -> None:  # a call with its permit, against the provider's bucket
        nonlocal level, filled, answered, answered_late, limited, limited_late
        level, filled = min(capacity, level + (now - filled) * rate), now
        late = now >= 60
        if level >= 1:
            level -= 1
            answered += 1
            answered_late += late
            heapq.heappush(events, (now + latency, "ok"))
        else:
            limited += 1
            limited_late += late
            heapq.heappush(events, (now + 0.005, f"429:{(1 - level) / rate:.4f}"))

    while events and now < seconds:
        now, what = heapq.heappop(events)
        if what == "ask":
            if quiet and int(now // QUIET) % 2:
                heapq.heappush(events, ((now // QUIET + 1) * QUIET, "ask"))
                continue
            delay, ticket = limiter.reserve(MODEL)
            if delay > 0:
                queue.append(ticket)
            else:
                send()
        elif what == "ok":
            limiter.report(MODEL, Answer())
            heapq.heappush(events, (now, "ask"))
        elif what.startswith("429"):
            wait = float(what.split(":")[1])
            limiter.report(MODEL, Answer(limited=True, retry_after=wait if retry_after and wait else None))
            heapq.heappush(events, (now, "ask"))
        while queue:  # the head of the queue asks again when it is due
            delay, _ = limiter.reserve(MODEL, 1, queue[0])
            if delay > 0:
                if not now < tick_at <= now + delay:  # one wake-up at a time, the earliest needed
                    tick_at = now + delay
                    heapq.heappush(events, (tick_at, "tick"))
                break
            queue.pop(0)
            send()
    late_seconds = max(1.0, seconds - 60) / (2 if quiet else 1)  # the seconds calls were asked for
    return {
        "achieved": answered_late / late_seconds / rate,
        "share_429_late": limited_late / max(1, limited_late + answered_late),
        "share_429": limited / max(1, limited + answered),
        "final_rpm": None if learner.rate is None else learner.rate * 60,
    }


def controllers(args) -> None:
    from evolver.ratelimit.learning import Learner

    rules = {
        "additive +1% of the limit/s, halve": lambda rpm: AIMD(step=rpm / 60 * 0.01),
        "additive +5% of the limit/s, halve": lambda rpm: AIMD(step=rpm / 60 * 0.05),
        "+5%/s, halve (evolver)": lambda rpm: Learner(),
        "+3%/s, x0.7": lambda rpm: Learner(cut=0.7, growth=0.03),
        "+2%/s, x0.9 of measured throughput": lambda rpm: Learner(cut=0.9, growth=0.02, measured=True),
        "+3%/s, x0.8 of measured throughput": lambda rpm: Learner(cut=0.8, growth=0.03, measured=True),
        "+5%/s, x0.5 of measured throughput": lambda rpm: Learner(cut=0.5, growth=0.05, measured=True),
    }
    print(f"virtual time, {args.rpm:g} rpm, latency {args.latency:g} s, demand {args.demand:g}x the limit, 600 s; after the first minute:")
    print(
        f"{'rule (growth, cut)':38} {'bucket':>7} {'Retry-After':>12} {'demand':>7} {'achieved/limit':>15} {'429 share':>10} "
        f"{'(all 600 s)':>11} {'final rpm':>10}"
    )
    for name, make in rules.items():
        for retry_after in (True, False):
            for burst in (2.0, 60.0):
                for quiet in (False, True):
                    got = simulate(make(args.rpm), args.rpm, burst, args.latency, args.demand, 600.0, retry_after, quiet)
                    print(
                        f"{name:38} {burst:>6g}s {'read' if retry_after else 'none':>12} {'gaps' if quiet else 'steady':>7} "
                        f"{got['achieved']:>15.3f} {got['share_429_late']:>10.3f} {got['share_429']:>11.3f} {got['final_rpm'] or 0:>10.0f}",
                        flush=True,
                    )


# ---- evolver against the fake provider --------------------------------------------------------


def _repo(root: Path) -> Path:
    from tests.conftest import init_repo

    return init_repo(root / "target")


def _env(mode: str, runtime: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("EVOLVER_")}
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        EVOLVER_RUNTIME_DIR=str(runtime),
        EVOLVER_ZYGOTE_IDLE="120",
        EVOLVER_RETRY_WAIT="0.5",
    )
    if mode == "off":
        env["EVOLVER_RATE_LIMITER"] = "off"
    return env


def _flags(kind: str, mode: str, fake, args, backend: str, address: str) -> list[str]:
    flags = ["--api-base", fake.api_base, "--backend", backend] + (["--ray-address", address] if address else [])
    for role in ("agent", "user", "judge") + (("meta",) if kind == "run" else ()):  # one model; the body says which script answers
        flags += [f"--{role}-model", f"openai/{MODEL}", f"--{role}-arg", f'extra_body={{fake_role = "{role}"}}']
    if mode == "configured":
        flags += ["--rate-limit", f"openai/{MODEL}={args.rpm:g}/{args.tpm:g}" if args.tpm else f"openai/{MODEL}={args.rpm:g}"]
    return flags


@contextlib.contextmanager
def ray_cluster(cpus: int = 4):
    """A local Ray instance started with `ray start --num-cpus 4`: the Ray backend gives it two groups of two
    worker processes each (four workers); stopped by pid (not `ray stop`, which stops every instance here)."""
    root = Path(tempfile.mkdtemp(prefix="evolver-rl-ray-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # its own token, as tests/test_ray.py's cluster
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(
        auth,
        RAY_USAGE_STATS_ENABLED="0",
        EVOLVER_RUNTIME_DIR=str(root / "zygote"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    start = subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--port",
            str(port),
            "--num-cpus",
            str(cpus),
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
        if start.returncode:
            raise SystemExit(f"ray start failed: {start.stderr[-2000:]}")
        os.environ.update(auth)  # the evolver commands join with it
        yield f"127.0.0.1:{port}"
    finally:
        for key in auth:
            os.environ.pop(key, None)
        from tests.test_ray import descendants, processes_with

        for sig in (signal.SIGTERM, signal.SIGKILL):
            daemons = processes_with(str(root))
            for pid in set(daemons).union(*(descendants(pid) for pid in daemons)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(2)
        shutil.rmtree(root, ignore_errors=True)


def measure(kind: str, backend: str, mode: str, args, root: Path, address: str = "") -> dict:
    from tests.scripts.fake_openai import FakeOpenAI, Limit

    if kind == "run":  # the loop's target: an agent that fails until a candidate adds the rule it lacks; 4 distinct candidates
        from tests.test_loop import make_target

        repo = make_target(root / f"{kind}-{backend}-{mode}" / "target")
        os.environ["EVOLVER_SCRIPT"] = "tests.scripts.loop_cases:distinct_candidates_script"  # the fake provider answers here
    else:
        repo = _repo(root / f"{kind}-{backend}-{mode}")
        os.environ.pop("EVOLVER_SCRIPT", None)
    runtime = Path(tempfile.mkdtemp(prefix="evolver-rl-rt-"))
    concurrency = max(1, round(args.demand * args.rpm / 60 * args.latency))
    limit = Limit(
        rpm=args.rpm, tpm=args.tpm, burst=args.burst, latency=args.latency, errors=args.errors, slow=args.slow, headers=mode == "headers"
    )
    env = _env(mode, runtime)
    with FakeOpenAI(limit=limit, lifetime=3600) as fake:
        started = time.monotonic()
        if kind == "eval":
            trials = max(1, -(-args.sims // len(TASKS)))
            cmd = ["eval", str(repo), "--json", "--task-ids", ",".join(TASKS), "--trials", str(trials), "--concurrency", str(concurrency)]
        else:
            cmd = [
                "run",
                str(repo),
                "--iterations",
                "1",
                "--candidates",
                "4",
                "--gate-stages",
                "1",
                "--no-holdout",
                "--proposer",
                "oneshot",
                "--concurrency",
                str(concurrency),
            ]
        proc = subprocess.run(
            [sys.executable, "-m", "evolver", *cmd, *_flags(kind, mode, fake, args, backend, address)],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        wall = time.monotonic() - started
        answered, limited, refused = list(fake.answered), sum(fake.limited.values()), list(fake.refused)
    subprocess.run([sys.executable, "-m", "evolver", "daemon", "stop"], env=env, capture_output=True)
    results = [json.loads(p.read_text()) for p in (repo / "runs").rglob("result*.json")]
    sims = [s for r in results for s in r["simulations"]]
    lost = sum(s["outcome"] == "infra_error" for s in sims)
    infra_rate = sum(1 for s in sims if s["outcome"] == "infra_error" and "RateLimit" in (s.get("error") or ""))
    span = (answered[-1] - answered[0]) if len(answered) > 1 else wall
    late = [t for t in answered if t - started >= LEARNT_AFTER]
    late_refused = [t for t in refused if t - started >= LEARNT_AFTER]
    return {
        "kind": kind,
        "backend": backend,
        "mode": mode,
        "exit": proc.returncode,
        "completed": len(sims) - lost,
        "lost": lost,
        "infra_rate_limited": infra_rate,
        "calls": len(answered),
        "limited": limited,
        "share_429": limited / max(1, limited + len(answered)),
        "achieved": (len(answered) / span * 60 / args.rpm) if span else 0.0,
        "wall": wall,
        "ideal": len(answered) / (args.rpm / 60),
        "late_calls": len(late),
        "share_429_late": len(late_refused) / max(1, len(late_refused) + len(late)),
        "timeline": _timeline(answered, refused, started),
        "summary": [r["summary"].get("rate_limits") for r in results],
        "stderr": proc.stderr[-1500:] if proc.returncode else "",
    }


def _timeline(answered: list[float], refused: list[float], started: float, step: float = 5.0) -> list[list[int]]:
    """[seconds from the start, calls answered, calls refused] per ``step`` seconds: where the 429s fall."""
    bins: dict[int, list[int]] = {}
    for index, times in ((1, answered), (2, refused)):
        for t in times:
            row = bins.setdefault(int((t - started) // step), [0, 0, 0])
            row[0], row[index] = int((t - started) // step * step), row[index] + 1
    return [bins[k] for k in sorted(bins)]


def table(rows: list[dict], args) -> str:
    head = (
        f"| run | backend | limiter | sims completed | lost | infra errors (429) | calls answered | 429s (share) | "
        f"429 share after {LEARNT_AFTER:g} s | achieved rpm / limit | wall s | ideal s |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['backend']} | {r['mode']} | {r['completed']} | {r['lost']} | {r['infra_rate_limited']} | {r['calls']} | "
            f"{r['limited']} ({100 * r['share_429']:.1f}%) | {100 * r['share_429_late']:.1f}% | {r['achieved']:.2f} | {r['wall']:.0f} | "
            f"{r['ideal']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=float, default=600.0)
    parser.add_argument("--tpm", type=float, default=0.0)
    parser.add_argument("--burst", type=float, default=2.0, help="seconds of the limit the provider's bucket holds")
    parser.add_argument("--latency", type=float, default=0.3)
    parser.add_argument("--demand", type=float, default=8.0, help="calls asked for / calls the limit allows")
    parser.add_argument("--errors", type=float, default=0.0, help="share of calls answered 500")
    parser.add_argument("--slow", type=float, default=0.0, help="share of calls 2 s slower")
    parser.add_argument("--sims", type=int, default=48, help="simulations of the eval (rounded up to whole trials of 8 tasks)")
    parser.add_argument("--backends", default="local,ray")
    parser.add_argument("--limiter", default="learnt,headers,configured,off")
    parser.add_argument("--kinds", default="eval", help="eval and/or run (`evolver run --iterations 1 --candidates 4`)")
    parser.add_argument("--controllers", action="store_true", help="only compare the learning rules, in virtual time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.controllers:
        controllers(args)
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="evolver-rl-") as tmp:
        for backend in args.backends.split(","):
            with ray_cluster() if backend == "ray" else contextlib.nullcontext("") as address:
                for mode in args.limiter.split(","):
                    for kind in args.kinds.split(","):
                        row = measure(kind, backend, mode, args, Path(tmp), address)
                        rows.append(row)
                        print(json.dumps({k: v for k, v in row.items() if k not in ("summary", "timeline")}), file=sys.stderr, flush=True)
    print(
        f"limit {args.rpm:g} rpm" + (f", {args.tpm:g} tpm" if args.tpm else "") + f", latency {args.latency:g} s, "
        f"demand {args.demand:g}x the limit, provider bucket {args.burst:g} s"
    )
    print(json.dumps(rows, indent=2) if args.json else table(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
