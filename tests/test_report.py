"""The run report (`evolver report`) and experiment tracking (`evolver run --track mlflow`), on real runs.

Two scripted runs (tests/scripts/report_cases.py), with real tau2, git and subprocesses:
- three iterations of two candidates each, with a price per token and a holdout: kept 1a, then 3a
  on it (a lineage of two steps over a gap), rejected 1b and 2a, an invalid 2b, and 3b refused (it
  edits evolver itself). It runs with tracking off and a stand-in mlflow
  first on PYTHONPATH that records any import of it;
- two iterations tracked in MLflow's file store (mlruns/ in the repository), with no price:
  1 rejected, 2 kept.
The report is opened in headless Chromium (Debian's `chromium`): no console error, no request
but the file itself, the charts drawn with the run's points, the lineage and the candidates.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from evolver.cli.runreport.facts import cost_of
from evolver.data import RoleUsage
from tests.chromium import INSTALL_HINT, visit
from tests.conftest import ROOT, SCRIPTED_MODELS, git, run_cli
from tests.test_loop import make_target, run_id_of

SCRIPT = "tests.scripts.report_cases:script"
NO_MLFLOW = ROOT / "tests" / "scripts" / "no_mlflow"  # an `mlflow` that records being imported, then fails
CANDIDATES = [  # label, parent, title, verdict shown
    ["1a", "base", "Keep the user's exact title", "kept"],
    ["1b", "base", "Transfer everyone", "rejected"],
    ["2a", "1a", "Be courteous", "rejected"],
    ["2b", "1a", "Break the state class", "invalid"],
    ["3a", "1a", "Check every detail", "kept"],
    ["3b", "1a", "Edit the optimizer", "refused"],
]


def _without_mlflow(marker: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(NO_MLFLOW), os.environ["PYTHONPATH"]]), "EVOLVER_TEST_MLFLOW_TRIPWIRE": str(marker)}


@pytest.fixture(scope="module")
def report_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    repo = make_target(base / "target")
    marker = base / "mlflow-imported"
    env = {
        "EVOLVER_SCRIPT": SCRIPT,
        "EVOLVER_TEST_PLAN": "exact+worse,note+broken,thorough+optimizer",
        "EVOLVER_SCRIPTED_PRICE": "0.002",
        **_without_mlflow(marker),
    }
    # The story below is the per-decision gate's (each candidate against the incumbent's fresh reference);
    # the default policy's screen and audit are shown by test_loop's runs.
    proc = run_cli(
        [
            "run",
            str(repo),
            "--iterations",
            "3",
            "--candidates",
            "2",
            "--gate-stages",
            "1,2",
            "--holdout",
            "--gate-policy",
            "per-decision",
            "--concurrency",
            "8",
            "--proposer",
            "oneshot",
            *SCRIPTED_MODELS,
        ],
        env=env,
        timeout=1200,
    )  # a broken patch reaches the loop
    assert proc.returncode == 0, proc.stderr[-3000:]
    return repo, run_id_of(repo), marker, env


@pytest.mark.slow
def test_tracking_off_never_imports_mlflow(report_run, tmp_path):
    repo, _, marker, env = report_run
    assert not marker.exists(), marker.read_text()  # the run, its workers and its daemon never imported it
    assert not (repo / "mlruns").exists()
    probe = tmp_path / "probe"  # the stand-in does record an import: the check above can fail
    proc = subprocess.run(
        [sys.executable, "-c", "import mlflow"],
        env={**os.environ, **env, "EVOLVER_TEST_MLFLOW_TRIPWIRE": str(probe)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "No module named 'mlflow'" in proc.stderr and probe.exists()


@pytest.mark.slow
def test_report_is_one_file_that_needs_no_network(report_run):
    repo, run_id, _, env = report_run
    proc = run_cli(["report", run_id, "--repo", str(repo)], env=env)
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == repo / "runs" / run_id / "report.html"
    html = path.read_text()
    assert "plotly.js v" in html  # embedded, not fetched
    assert _loads(html) == []  # no element that loads anything: no src, no href, no <link>
    assert git(repo, "status", "--porcelain") == ""  # runs/ stays ignored


def _loads(html: str) -> list[str]:
    """The page's elements that would fetch something, as tag: attribute."""
    found = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(f"{tag}: {name}" for name, value in attrs if name in ("src", "href", "srcset", "data", "poster") or tag == "link")

    Parser().feed(html)
    return found


@pytest.mark.slow
def test_report_opens_in_headless_chromium(report_run, tmp_path):
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.fail(INSTALL_HINT)
    repo, run_id, _, env = report_run
    assert run_cli(["report", run_id, "--repo", str(repo)], env=env).returncode == 0
    page = repo / "runs" / run_id / "report.html"
    full, top = tmp_path / "report-full.png", tmp_path / "report.png"
    seen = visit(page, PROBE, {full: (0, 0), top: (0, 1500)})
    print(f"screenshots: {full} {top}")
    assert seen.console_errors == []
    assert [url for url in seen.requests if not url.startswith("data:")] == [page.as_uri()]  # data: URLs are plotly's own images
    dom = seen.dom
    # The score chart: the incumbent over iterations 0-3, its analysis score at 0 and 1 (3a's was never measured:
    # no iteration came after it), and each candidate measured on the gate.
    assert dom["traces"]["score-chart"] == [
        {"name": "incumbent (gate)", "text": None, "points": 4},
        {"name": "incumbent (analysis)", "text": None, "points": 2},
        {"name": "kept", "text": ["1a", "3a"], "points": 2},
        {"name": "rejected", "text": ["1b", "2a"], "points": 2},
    ]
    assert dom["score_y"] == {"incumbent (gate)": [0.5, 0.5, 0.75, 0.75], "kept": [0.75, 1.0], "rejected": [0.0, 0.75]}
    lineage = {t["name"]: t["text"] for t in dom["traces"]["lineage-chart"] if t["name"]}
    assert lineage == {"base": ["base"], "kept": ["1a", "3a"], "rejected": ["1b", "2a"], "invalid": ["2b"], "refused": ["3b"]}
    assert dom["lineage_list"] == [
        "base main " + git(repo, "rev-parse", "--short=10", "main").strip(),
        f"1a on base: Keep the user's exact title (+25.0 points) evolver/{run_id}/iter-001a",
        f"3a on 1a: Check every detail (+25.0 points) evolver/{run_id}/iter-003a = best",
    ]
    assert dom["best_annotation"] == f"best: evolver/{run_id}/best"
    assert [row[:4] for row in dom["candidates"]] == CANDIDATES
    assert dom["grid"] == {"columns": ["base", "1a", "1b", "2a", "3a"], "rows": 40, "up": 20, "down": 20}  # 1a, 3a: 10 up; 1b: 20 down
    assert dom["holdout"].startswith("On 1 sealed task(s) x 2 trial(s), never used for any decision: base ")
    # Dollars where the run recorded a cost, "unknown" where it recorded tokens at $0 (never "$0.0000").
    state = json.loads((repo / "runs" / run_id / "state.json").read_text())
    for role, usage in state["usage"].items():
        cells = [row[role] for row in dom["costs"] if role in row]
        assert cells and all(cell == "unknown" if usage["cost"] == 0 else cell.startswith("$") for cell in cells), (role, cells)
    assert "agent" in dom["cost_traces"] and "user" in dom["cost_traces"]
    assert full.stat().st_size > 50_000 and top.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PROBE = """(() => {
  const ids = ['score-chart', 'lineage-chart', 'cost-chart', 'task-grid'];
  const chart = id => document.getElementById(id);
  if (!ids.every(id => chart(id) && chart(id).querySelector('.main-svg'))) return {ready: false};
  const traces = id => [...chart(id).querySelectorAll('.scatterlayer .trace')].map((t, i) => ({
      name: chart(id).data[i].name || null, text: chart(id).data[i].text || null, points: t.querySelectorAll('.point').length}));
  const grid = chart('task-grid').data[0];
  const marks = grid.text.flat();
  return {
    ready: true,
    traces: {'score-chart': traces('score-chart'), 'lineage-chart': traces('lineage-chart')},
    score_y: Object.fromEntries(chart('score-chart').data.filter(t => t.name !== 'incumbent (analysis)').map(t => [t.name, t.y])),
    best_annotation: chart('lineage-chart').querySelector('.annotation-text').textContent,
    lineage_list: [...document.querySelectorAll('#lineage-list li')].map(li => li.innerText.trim()),
    candidates: [...document.querySelectorAll('#candidates-table tr.candidate')].map(r => [...r.cells].map(c => c.innerText.trim().replace(' ★', ''))),
    grid: {columns: grid.x, rows: grid.y.length, up: marks.filter(m => m === '▲').length, down: marks.filter(m => m === '▼').length},
    holdout: document.getElementById('holdout-result').innerText,
    costs: [...document.querySelectorAll('#cost-table tr')].slice(1).map(r => Object.fromEntries(
        [...r.cells].map((c, i) => [document.querySelector('#cost-table tr').cells[i].innerText, c.innerText.trim()])
          .filter(([head, text]) => head.endsWith(' cost') && text).map(([head, text]) => [head.replace(' cost', ''), text]))),
    cost_traces: chart('cost-chart').data.map(t => t.name),
  };
})()"""


@pytest.mark.slow
def test_markdown_summary_for_a_pull_request(report_run):
    repo, run_id, _, env = report_run
    proc = run_cli(["report", run_id, "--repo", str(repo), "--markdown"], env=env)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith(f"### evolver run `{run_id}`\n")
    assert "Kept lineage: base → 1a Keep the user's exact title (+25.0 points) → 3a Check every detail (+25.0 points)." in text
    assert "| 3a ★ | Check every detail | 0.750 → 1.000 | +25.0 points | kept |" in text
    assert "| 2a | Be courteous | 0.750 → 0.750 | +0.0 points | rejected |" in text
    assert "| 1b | Transfer everyone | 0.500 → 0.000 | -50.0 points | rejected |" in text
    assert "| 2b | Break the state class | 0.750 → - | - | invalid |" in text
    assert f"Adopt it with `git merge evolver/{run_id}/best`." in text
    assert "Holdout (1 sealed task(s) x 2 trial(s), never used for a decision): base " in text
    assert "3 gate decision(s)" in text  # one per iteration that reached the gate, however many candidates
    state = json.loads((repo / "runs" / run_id / "state.json").read_text())
    for role, usage in state["usage"].items():  # dollars where a cost was recorded, else unknown: never $0
        assert f"{role} {'unknown' if usage['cost'] == 0 else '$'}" in text.split("Cost: ")[1], role
    assert proc.stderr.strip() == f"report: {repo / 'runs' / run_id / 'report.html'}"


def test_a_cost_without_a_price_is_unknown_never_zero():
    assert cost_of(RoleUsage(prompt_tokens=120, completion_tokens=30, cost=0.0)).text() == "unknown"
    assert cost_of(RoleUsage(prompt_tokens=120, completion_tokens=30, cost=0.25)).text() == "$0.2500"
    assert cost_of(RoleUsage()).text() == "$0.0000"  # nothing used, nothing spent


# -- MLflow --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    repo = make_target(tmp_path_factory.mktemp("tracked") / "target")
    env = {"EVOLVER_SCRIPT": SCRIPT, "EVOLVER_TEST_PLAN": "worse,exact"}
    proc = run_cli(
        [
            "run",
            str(repo),
            "--iterations",
            "2",
            "--candidates",
            "1",
            "--gate-policy",
            "per-decision",
            "--gate-stages",
            "1,2",
            "--no-holdout",
            "--track",
            "mlflow",
            "--concurrency",
            "8",
            *SCRIPTED_MODELS,
        ],
        env=env,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return repo, run_id_of(repo), proc


def _client(uri: str):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 reads its file store only when asked
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow
def test_mlflow_holds_the_settings_metrics_verdicts_and_report(tracked_run, tmp_path):
    repo, run_id, proc = tracked_run
    client = _client((repo / "mlruns").as_uri())
    [found] = client.search_runs(
        [client.get_experiment_by_name("evolver").experiment_id], filter_string=f"tags.`evolver.run_id` = '{run_id}'"
    )
    mlflow_id = found.info.run_id
    assert found.info.status == "FINISHED" and found.info.run_name == run_id
    params = found.data.params
    assert params["config.domain"] == "evolver_gen" and params["config.track"] == "mlflow" and params["gate.stages"] == "1, 2"
    assert params["model.agent"] == "scripted/agent" and params["tasks.gate"] == "40"
    assert _history(client, mlflow_id, "gate_incumbent") == [(0, 0.5), (1, 0.5), (2, 0.5)]
    assert _history(client, mlflow_id, "kept") == [(1, 0.0), (2, 1.0)]
    assert _history(client, mlflow_id, "candidate/gate") == [(1, 0.0), (2, 0.75)]
    assert _history(client, mlflow_id, "candidate/effect") == [(1, -0.5), (2, 0.25)]
    assert _history(client, mlflow_id, "candidate/accepted") == [(1, 0.0), (2, 1.0)]
    assert _history(client, mlflow_id, "analysis_incumbent") == [(0, 0.5)]  # the kept candidate's is measured by a next iteration
    tags = found.data.tags
    assert tags["verdict.1"].startswith("rejected: Rejected early") and tags["verdict.2"].startswith("accepted: Accepted: +25.0 points")
    assert tags["evolver.status"] == "stopped" and tags["evolver.best_branch"] == f"evolver/{run_id}/best"
    # No price for the scripted models: tokens are logged, dollars are not (never $0).
    assert _history(client, mlflow_id, "tokens/agent") and not _history(client, mlflow_id, "cost_usd/agent")
    assert not any(key.startswith(("cost_usd/", "total_cost_usd/")) for key in found.data.metrics)
    local = Path(client.download_artifacts(mlflow_id, "report.html", str(tmp_path)))
    assert local.read_bytes() == (repo / "runs" / run_id / "report.html").read_bytes()
    assert git(repo, "status", "--porcelain") == ""  # mlruns/ is ignored by git, like runs/
    summary = run_cli(["report", run_id, "--repo", str(repo), "--markdown"]).stdout
    assert "Cost: agent unknown (" in summary and "$0.00" not in summary


@pytest.mark.slow
def test_mlflow_tracking_uri_is_honoured_and_a_reopened_run_logs_nothing_twice(tracked_run, tmp_path, monkeypatch):
    from rich.console import Console

    from evolver.cli.tracking.mlflow_tracker import MlflowTracker
    from evolver.store.rundir import RunDir

    repo, run_id, _ = tracked_run
    uri = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = RunDir(repo, run_id)
    first = MlflowTracker(run, Console(quiet=True))
    first.sync()  # everything the run store holds
    client = _client(uri)
    assert _history(client, first.mlflow_run_id, "kept") == [(1, 0.0), (2, 1.0)]
    again = MlflowTracker(run, Console(quiet=True))  # as a resumed run reopens it
    assert again.mlflow_run_id == first.mlflow_run_id
    again.sync()
    again.finish("interrupted")
    assert _history(client, first.mlflow_run_id, "kept") == [(1, 0.0), (2, 1.0)]
    assert _history(client, first.mlflow_run_id, "candidate/effect") == [(1, -0.5), (2, 0.25)]
    assert client.get_run(first.mlflow_run_id).info.status == "KILLED"
    default = _client((repo / "mlruns").as_uri())  # the repository's own store got nothing from this
    assert len(default.search_runs([default.get_experiment_by_name("evolver").experiment_id])) == 1
