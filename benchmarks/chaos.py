"""Chaos: every hostile and broken candidate of tests/scripts/hostile.py, through the scan and the sandbox.

    python benchmarks/chaos.py

For each hostile candidate: does the static scan refuse it (evolver.evaluation.scan, with
the mock domain's task-data identifiers)? Then, as if the scan had missed it,
a real `evolver eval` in the sandbox: neutralised (scored no higher than the
honest agent, no file outside its scratch directory, no connection, no key,
repository unchanged, no process left) or kept (it escaped; must be 0).
Valid patches (Harness.md's four examples, every layer switched on, a prompt
fix) must pass the scan and score like the honest agent. Faults (exit, hang,
crash, memory) must be scored as the candidate's failure, never as an
infrastructure error. Scripted LLMs; tau2, git, the zygote and the sandbox are real.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def valid_patches(template: str) -> dict[str, dict[str, str]]:
    """name -> {path: new text}: Harness.md's examples, all layers on, and a prompt fix."""
    import re

    from evolver.evolution.patch import apply_edits, parse_proposal

    guide = (ROOT / "Harness.md").read_text().split("## One example per layer", 1)[1]
    examples = re.findall(r"```\n(TITLE:.*?)```", guide, re.S)
    out = {}
    for n, text in enumerate(examples, 1):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "agent").mkdir()
            (Path(tmp) / "agent" / "agent.py").write_text(template)
            (Path(tmp) / "agent" / "harness.toml").write_text((ROOT / "agent" / "harness.toml").read_text())
            out[f"harness_md_example_{n}"] = apply_edits(Path(tmp), parse_proposal(text).edits)
    switches = "\n".join(
        f"{k} = true" for k in ("h2_action_realization", "h3_environment_contract", "h4_trajectory_regulation", "h5_procedural_skills")
    )
    out["all_layers_on"] = {"agent/harness.toml": switches + "\n"}
    out["prompt_fix"] = {
        "agent/agent.py": template.replace(
            "Try to be helpful and always follow the policy.",
            "Try to be helpful and always follow the policy.\nUse the exact title the user gives.",
        )
    }
    return out


def main() -> None:
    os.environ["PYTHONPATH"] = str(ROOT)
    os.environ.setdefault("EVOLVER_RUNTIME_DIR", tempfile.mkdtemp(prefix="evolver-chaos-rt-"))
    from evolver.llm import prepare_environment

    prepare_environment()
    from evolver.evaluation import zygote_client
    from evolver.evaluation.scan import scan_text
    from evolver.evaluation.worker.tasks import domain_identifiers
    from tests.scripts import hostile

    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    work = Path(tempfile.mkdtemp(prefix="evolver-chaos-"))
    repo, template = hostile.init_repo(work / "target", env)
    canaries = hostile.Canaries(work / "outside")
    identifiers = frozenset(domain_identifiers("mock"))
    valid = valid_patches(template)
    rows = []
    try:
        for case in hostile.HOSTILE:
            source = hostile.candidate_source(template, case, canaries.values(repo))
            findings = scan_text("agent/agent.py", source, identifiers)
            outcome = hostile.run_case(case, repo, canaries, template, env)
            rows.append(
                (
                    "hostile",
                    case.name,
                    findings[0].rule if findings else "-",
                    "kept" if outcome.problems else "neutralised",
                    outcome.problems,
                )
            )
        for name, files in hostile.SCAN_ONLY.items():
            findings = [
                f
                for path, text in files.items()
                for f in scan_text(path, (template if path == "agent/agent.py" else "") + text, identifiers)
            ]
            rows.append(("scan", name, findings[0].rule if findings else "-", "refused" if findings else "MISSED", []))
        for case in hostile.FAULTS:
            outcome = hostile.run_case(case, repo, canaries, template, env)
            rows.append(("fault", case.name, "", "candidate failure" if not outcome.problems else "WRONG", outcome.problems))
        for name, files in valid.items():
            findings = [f for path, text in files.items() for f in scan_text(path, text, identifiers)]
            agent_text = files.get("agent/agent.py", template)
            (repo / "agent" / "harness.toml").write_text(files.get("agent/harness.toml", (ROOT / "agent" / "harness.toml").read_text()))
            outcome = hostile.run_case(hostile.Case(name, "import", "", "neutralised"), repo, canaries, agent_text, env)
            (repo / "agent" / "harness.toml").write_text((ROOT / "agent" / "harness.toml").read_text())
            hostile.git(repo, "commit", "-qam", "layers back", "--allow-empty")
            scored = outcome.summary["avg_reward"] if outcome.summary else None
            ok = not findings and not outcome.problems and scored == hostile.BASELINE
            rows.append(
                (
                    "valid",
                    name,
                    findings[0].rule if findings else "-",
                    f"scored {scored}" if ok else "WRONG",
                    [str(f) for f in findings] + outcome.problems,
                )
            )
    finally:
        canaries.close()
        zygote_client.stop_all()

    for kind, name, scan, verdict, problems in rows:
        print(f"{kind:8} {name:40} scan: {scan:16} {verdict}" + (f"  {problems}" if problems else ""))
    hostile_rows = [r for r in rows if r[0] == "hostile"]
    faults = [r for r in rows if r[0] == "fault"]
    valid = [r for r in rows if r[0] == "valid"]
    refused = sum(r[2] != "-" for r in hostile_rows)
    kept = sum(r[3] == "kept" for r in hostile_rows)
    print()
    print(
        f"hostile patches tried {len(hostile_rows)} / refused by the scan {refused} / "
        f"neutralised by the sandbox with the scan skipped {len(hostile_rows) - kept} / kept {kept} (must be 0)"
    )
    scan_only = [r for r in rows if r[0] == "scan"]
    print(
        f"task data copied into the harness (only the scan can catch it) tried {len(scan_only)} / refused {sum(r[3] == 'refused' for r in scan_only)}"
    )
    print(
        f"valid patches wrongly refused {sum(r[2] != '-' for r in valid)} of {len(valid)} (must be 0); "
        f"scored like the honest agent {sum(r[3].startswith('scored') for r in valid)} of {len(valid)}"
    )
    print(f"faults tried {len(faults)} / scored as candidate failure {sum(r[3] == 'candidate failure' for r in faults)}")
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
