"""`evolver compare` and `evolver transfer` through the command line, scripted models, real tau2 and git;
and the two-sided group-sequential test itself on tables."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from evolver.evolution.gate.compare import CompareConfig, decide_compare, next_tasks, run_compare
from evolver.evolution.gate.sequential import plan, windows
from tests.conftest import LINEAGE, SCRIPTED_MODELS, git, run_cli
from tests.scripts.loop_cases import EXACT
from tests.test_loop import make_target

ENV = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:script"}
MODELS = SCRIPTED_MODELS[:6]  # agent, user, judge
ON_TEST = ["--split", "test", "--concurrency", "8"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """main: the loop tests' agent, which garbles odd-numbered titles; branch exact: told to keep them."""
    path = make_target(tmp_path_factory.mktemp("compare") / "target")
    git(path, "checkout", "-q", "-b", "exact")
    agent = path / "agent" / "agent.py"
    agent.write_text(agent.read_text().replace('AGENT_INSTRUCTION = """\n', f'AGENT_INSTRUCTION = """\n{EXACT}\n', 1))
    git(path, "commit", "-qam", "keep the exact title")
    git(path, "checkout", "-q", "main")
    return path


def compare(repo: Path, *args: str) -> tuple:
    proc = run_cli(["compare", *args, "--repo", str(repo), "--json", *MODELS, *ON_TEST], env=ENV, timeout=900)
    record = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, record


def test_a_better_agent_is_called_better_early_and_the_reverse_worse(repo):
    proc, record = compare(repo, "main", "exact")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert record["decision"] == "better" and record["effect"] > 0.3 and record["ci"][0] > 0 and record["p_value"] < 1e-5
    assert len(record["looks"]) == 1  # 20 of 40 tasks flipped at the first trial: clear at the first look
    assert record["worse_on"] == [] and len(record["better_on"]) == 20  # the 20 odd-numbered titles of the 40 test tasks
    assert all(f["a"] == 0.0 and f["b"] == 1.0 for f in record["better_on"])
    on_disk = json.loads(Path(record["comparison_file"]).read_text())
    assert on_disk["decision"] == "better" and on_disk["simulations"] == record["simulations"]
    assert record["simulations"]["a"] == record["simulations"]["b"] == 40 * record["looks"][-1]["trials"]
    assert (Path(record["comparison_file"]).parent / "a" / "sims.jsonl").exists()
    proc, reverse = compare(repo, "exact", "main")
    assert proc.returncode == 0 and reverse["decision"] == "worse" and reverse["effect"] == pytest.approx(-record["effect"])
    assert git(repo, "status", "--porcelain").strip() == "" and "exact" in git(repo, "branch", "--list")  # nothing touched


def test_the_same_agent_twice_is_no_evidence_and_tasks_that_always_agree_stop_running(repo):
    proc, record = compare(repo, "main", str(repo))  # a ref and a folder holding the same agent
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert record["decision"] == "no evidence" and record["effect"] == 0.0
    assert record["p_value"] == 1.0  # every paired difference is 0: nothing is less likely than that under no effect
    # nothing varied on 40 tasks: already more information than a 10-point difference needs, so one look is enough
    assert len(record["looks"]) == 1
    # one task of five differs (gen_09's odd title): the four that always agree stop running after 3 trials each,
    # and the one that differs runs on until a one-sided test calls B better
    five = "gen_08,gen_09,gen_10,gen_12,gen_14"
    text = run_cli(
        ["compare", "main", "exact", "--repo", str(repo), *MODELS, *ON_TEST, "--better", "--task-ids", five], env=ENV, timeout=900
    )
    assert text.returncode == 0, text.stderr[-2000:]
    assert "B better on 1 task(s): gen_09 0.00->1.00" in text.stdout and "A = main, B = exact: better" in text.stdout
    looks = [line for line in text.stderr.splitlines() if line.startswith("look ")]
    assert len(looks) == 6 and "spent 36 simulations (18 + 18)" in text.stdout  # 5 tasks x 3 looks, then gen_09 alone


@pytest.mark.parametrize(
    "args, message",
    [
        (["main", "no-such-branch"], "'no-such-branch' is neither a folder nor a git ref"),
        (["main", "exact", "--run", "run-nope"], "unknown run id 'run-nope'"),
        (["main", "exact", "--domain", "nope"], "unknown domain 'nope'"),
        (["main", "exact", "--task-ids", "gen_99"], "unknown task id"),
    ],
)
def test_bad_input_gets_one_line_and_nothing_is_left(repo, args, message):
    before = sorted(p.name for p in (repo / "runs").iterdir())
    proc = run_cli(["compare", *args, "--repo", str(repo), *MODELS, "--split", "test"], env=ENV)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in (repo / "runs").iterdir()) == before


@pytest.mark.parametrize("rewards, settle", [((0.0, 1.0), 0), ((0.0, 0.5, 1.0), 0), ((0.0, 1.0), 1)])
def test_every_relabelling_counted_the_error_is_at_most_alpha(rewards, settle):
    """Exactness, not a simulation: 3 tasks x 3 looks, each block's two results fixed, one trial lost to an
    infrastructure error; under no effect each of the 2^8 ways of giving a block's results to A and B is equally
    likely, and the procedure calls better or worse on at most alpha of them: on exactly the share its recursion
    over the lattice says. With ``settle``, task t0's first block agrees, so it stops running after one look
    (its later blocks, different, are never read), whichever way the other blocks fall."""
    config = CompareConfig(alpha=0.2, effect=0.3, max_trials=3, settle=settle)
    rng = random.Random(3)
    pooled = {(t, w): tuple(rng.sample(rewards, 2)) for t in range(3) for w in range(3)}
    if settle:
        pooled[(0, 0)] = (1.0, 1.0)
    lost = (1, 2)  # A's trial: the block has one side and is not compared
    called = []
    for swaps in itertools.product((False, True), repeat=len(pooled) - 1):
        a: dict = {f"t{t}": [None] * 3 for t in range(3)}
        b: dict = {f"t{t}": [None] * 3 for t in range(3)}
        for ((t, w), (x, y)), swap in zip([item for item in pooled.items() if item[0] != lost], swaps):
            a[f"t{t}"][w], b[f"t{t}"][w] = (y, x) if swap else (x, y)
        b[f"t{lost[0]}"][lost[1]] = pooled[lost][1]
        called.append(run_compare(a, b, config).decision in ("better", "worse"))
        assert next_tasks(a, b, config, 1) == (["t1", "t2"] if settle else ["t0", "t1", "t2"])
    exact = plan(windows(a, b, config.stages, settle), config.spending(), last=2, stop=False)[-1].error  # the recursion's own count
    assert sum(called) / len(called) == pytest.approx(exact) and 0 < exact <= config.alpha  # some of alpha is left unspent


@pytest.mark.parametrize("sided", ["two", "better"])
def test_p_is_1_when_no_trial_of_b_differs_from_as(sided):
    """Tasks that vary from trial to trial, alike for A and B: no block can be relabelled into anything else, so
    both one-sided p-values are 1 (through the command line: the same-agent test above)."""
    rng = random.Random(11)
    rates = [rng.random() for _ in range(10)]
    a = {f"t{i}": [float(rng.random() < p) for _ in range(20)] for i, p in enumerate(rates)}
    verdict = run_compare(a, {task: list(rows) for task, rows in a.items()}, CompareConfig(sided=sided))
    assert verdict.decision == "no evidence" and verdict.effect == 0.0 and verdict.p_value == 1.0


def test_a_no_op_is_rarely_called_anything_and_a_drift_between_looks_moves_nothing():
    """Both arms drift together between windows: the within-window relabelling sees no effect. Judged look
    by look as `evolver compare` does, which gives the same verdict as judging the whole tables at once."""
    rng = random.Random(7)
    config = CompareConfig()
    called = 0
    for _ in range(40):
        rates = [rng.random() for _ in range(30)]
        a: dict = {f"t{i}": [] for i in range(30)}
        b: dict = {f"t{i}": [] for i in range(30)}
        for look in range(config.max_trials):
            for i, p in enumerate(rates):
                moved = min(1.0, p + 0.1 * look)  # the whole system gets better between windows
                a[f"t{i}"].append(float(rng.random() < moved))
                b[f"t{i}"].append(float(rng.random() < moved))
            verdict = decide_compare(a, b, config, look=look)
            if verdict.decision != "continue":
                break
        assert verdict == run_compare(a, b, config)
        called += verdict.decision in ("better", "worse")
    assert called <= 5  # alpha 0.05 over 40 no-ops: 2 expected; 6 or more would be p < 0.05


def test_the_error_spent_grows_with_the_information_and_a_later_look_sees_only_its_windows():
    config = CompareConfig()
    rng = random.Random(5)
    a, b = ({f"t{i}": [float(rng.random() < 0.5) for _ in range(20)] for i in range(40)} for _ in "ab")
    looks = plan(windows(a, b, config.stages), config.spending(), last=19)
    assert len(looks) > 2 and not any(look.final for look in looks[:-1])
    taus = [look.tau for look in looks]
    spending = config.spending()
    assert taus == sorted(taus) and looks[0].alpha_spent < 0.005
    assert all(0 < look.alpha_spent <= 0.05 * spending.spent(look.tau, spending.alpha_shape) + 1e-12 for look in looks)
    assert plan(windows(a, b, config.stages[:3]), config.spending(), last=19) == looks[:3]


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    """A finished run that kept one candidate: the rule that fixes the loop tests' agent."""
    repo = make_target(tmp_path_factory.mktemp("transfer") / "target")
    env = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:investigator_script"}
    # the per-decision gate: no screen and no end-of-run audit (the audited policy is the loop tests'; here only the kept rule counts)
    proc = run_cli(
        [
            "run",
            str(repo),
            "--iterations",
            "1",
            "--candidates",
            "1",
            "--gate-stages",
            "1",
            "--gate-policy",
            "per-decision",
            "--no-holdout",
            "--concurrency",
            "8",
            *SCRIPTED_MODELS,
            "--transfer-models",
            "scripted/contrary",
        ],
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "transfers" in proc.stdout and "hurts" in proc.stdout  # --transfer-models ran at the end
    [run_id] = [p.name for p in (repo / "runs").glob("run-*")]
    assert json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["candidates"][0]["verdict"] == "accepted"
    return repo, run_id


@pytest.mark.slow
def test_transfer_says_helps_for_one_model_and_hurts_for_another(kept_run):
    repo, run_id = kept_run
    helps = run_cli(
        ["transfer", run_id, "--repo", str(repo), "--json", "--agent-model", "scripted/agent", "--concurrency", "8"], env=ENV, timeout=900
    )
    assert helps.returncode == 0, helps.stderr[-2000:]
    [pair] = json.loads(helps.stdout)["pairs"]
    assert (pair["a"], pair["b"], pair["verdict"]) == ("base", "best", "helps") and pair["effect"] > 0.3
    hurts = run_cli(
        ["transfer", run_id, "--repo", str(repo), "--agent-model", "scripted/contrary", "--concurrency", "8"], env=ENV, timeout=900
    )
    assert hurts.returncode == 0, hurts.stderr[-2000:]
    assert "hurts" in hurts.stdout and "scripted/contrary" in hurts.stdout
    history = json.loads(run_cli(["history", run_id, "--repo", str(repo), "--json"]).stdout)["transfers"]
    assert [(t["agent_model"], t["verdict"]) for t in history] == [
        ("scripted/contrary", "hurts"),
        ("scripted/agent", "helps"),
        ("scripted/contrary", "hurts"),
    ]
    status = run_cli(["status", run_id, "--repo", str(repo)])
    assert "transfer" in status.stdout and "hurts" in status.stdout
    assert "transfers" in run_cli(["history", run_id, "--repo", str(repo)]).stdout


@pytest.mark.slow
def test_compare_names_a_runs_candidates_as_the_readme_shows(kept_run):
    repo, run_id = kept_run
    # the kept candidate against the run's best, which it is: the names resolve to commits, and the same agent
    # twice stops with no evidence once 6 tasks that never vary hold twice a fixed-size test's information, after
    # 2 trials each (base's resolution is the transfers' above)
    # (scripted user and judge as everywhere here: with only the agent named, the user would be the embedded model)
    proc = run_cli(
        ["compare", "--run", run_id, "1", "best", "--repo", str(repo), "--json", *MODELS, "--concurrency", "8", "--num-tasks", "6"],
        env=ENV,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout)
    kept = git(repo, "rev-parse", f"evolver/{run_id}/iter-001").strip()
    assert record["a"]["commit"] == kept and record["b"]["commit"] == git(repo, "rev-parse", f"evolver/{run_id}/best").strip() == kept
    assert record["decision"] == "no evidence" and record["p_value"] == 1.0 and len(record["looks"]) == 2


def test_triage_flags_an_impossible_task_and_a_customer_who_leaves(tmp_path):
    repo = tmp_path / "target"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    assert run_cli(["init", str(repo)]).returncode == 0
    (repo / "evolver.toml").write_text(
        (repo / "evolver.toml")
        .read_text()
        .replace('domain = "mock"', 'domain = "evolver_triage"\nplugins = ["tests.scripts.triage_domain"]')
    )
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    env = {"EVOLVER_SCRIPT": "tests.scripts.triage_domain:script"}
    proc = run_cli(["eval", str(repo), "--json", *MODELS, "--trials", "3", "--concurrency", "8"], env=env)
    assert proc.returncode == 0, proc.stderr
    eval_id = json.loads(proc.stdout)["run_id"]
    flagged = {t["task"]: t["flags"] for t in json.loads(run_cli(["tasks", "--triage", eval_id, "--repo", str(repo), "--json"]).stdout)}
    assert flagged["tri_impossible"] == ["never passed"]
    assert flagged["tri_quitter"] == ["never passed", "the customer's doing"]
    assert all(flagged[f"tri_{n}"] == ["never varies"] for n in range(6))  # the scripted agent always passes them
    text = run_cli(["tasks", "--triage", eval_id, "--repo", str(repo)]).stdout
    assert (
        "tri_quitter: never passed (0 of 3 simulations passed); the customer's doing (3 of 3 failures: the customer stopped after" in text
    )
    dry = run_cli(["run", str(repo), "--dry-run", "--exclude-tasks", "tri_impossible,tri_quitter", *SCRIPTED_MODELS], env=env)
    assert dry.returncode == 0 and "2 task(s) excluded" in dry.stderr, dry.stderr
    bad = run_cli(["run", str(repo), "--dry-run", "--exclude-tasks", "tri_nope", *SCRIPTED_MODELS], env=env)
    assert bad.returncode == 2 and "exclude_tasks names task(s) evolver_triage does not have: tri_nope" in bad.stderr
    missing = run_cli(["tasks", "--triage", "run-nope", "--repo", str(repo)])
    assert missing.returncode == 2 and "no run, comparison or evaluation 'run-nope'" in missing.stderr


@pytest.mark.slow
def test_the_dry_run_forecast_is_within_a_quarter_of_what_the_run_spends(tmp_path):
    """--dry-run --pilot measures a few simulations and prices the run per role; the same run then spends
    within 25% of the expected dollars. (The one-shot proposer: its meta-LLM's prompt is known up front; the
    investigating one's is assumed to use half its token budget, which a scripted meta-agent does not.)"""
    import re

    repo = make_target(tmp_path / "target")
    env = {"EVOLVER_SCRIPT": "tests.scripts.loop_cases:fix_first_script", "EVOLVER_SCRIPTED_PRICE": "0.002"}
    args = [
        "--iterations",
        "1",
        "--gate-stages",
        "1",
        "--no-holdout",
        "--concurrency",
        "8",
        "--proposer",
        "oneshot",
        "--budget-usd",
        "100",
        *LINEAGE,
        *SCRIPTED_MODELS,
    ]
    dry = run_cli(["run", str(repo), "--dry-run", "--pilot", "4", *args], env=env, timeout=600)
    assert dry.returncode == 0, dry.stderr[-2000:]
    expected = float(re.search(r"the expected run fits \(expected \$([0-9.]+)", dry.stderr).group(1))
    assert re.search(r"agent: about [0-9,]+ tokens \(\$[0-9.]+\)", dry.stderr) and "meta: about" in dry.stderr
    assert not list((repo / "runs").glob("run-*"))  # a dry run leaves nothing, its pilot included
    proc = run_cli(["run", str(repo), *args], env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [run_id] = [p.name for p in (repo / "runs").glob("run-*")]
    spent = json.loads(run_cli(["status", run_id, "--repo", str(repo), "--json"]).stdout)["cost"]
    assert abs(expected - spent) <= 0.25 * spent, (expected, spent)
    assert "estimate of the rest of the run, priced by the baseline's simulations" in proc.stderr
