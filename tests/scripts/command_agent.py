"""A stand-in for an external coding agent (tests/test_proposer.py), run by the command proposer in its
workspace. `honest`: reads TASK.md and the analysis files, fixes agent/agent.py, writes PROPOSAL.md.
`hostile`: tries everything it must not be able to do, writes what worked to report.json, and leaves a
symbolic link and a pipe in agent/ for the trusted side to trip over. `sleep`: starts a child and hangs."""

import json
import os
import subprocess
import sys
from pathlib import Path

EXACT = "Use the exact title the user gives."


def honest() -> None:
    assert "Your task" in Path("TASK.md").read_text()
    failures = Path("analysis/failures.md").read_text()
    first = failures.split(":")[0].split(" trial ")
    trajectory = Path(f"analysis/{first[0]}-trial{first[1]}.md").read_text()
    assert "create_task(" in trajectory
    agent = Path("agent/agent.py")
    agent.write_text(agent.read_text().replace('AGENT_INSTRUCTION = """\n', f'AGENT_INSTRUCTION = """\n{EXACT}\n', 1))
    Path("PROPOSAL.md").write_text("TITLE: Keep the user's exact title\nRATIONALE: the trajectory shows a garbled create_task title\n")


def attempt(report: dict, name: str, action) -> None:
    try:
        action()
        report[name] = "done"
    except Exception as exc:  # noqa: BLE001
        report[name] = f"failed: {type(exc).__name__}"


def hostile() -> None:
    report: dict = {}
    here = Path.cwd()
    run = here.parents[2]  # runs/<id>/proposals/<slug>/workspace
    attempt(report, "read_run_state", lambda: (run / "state.json").read_text())
    attempt(report, "read_run_manifest", lambda: (run / "run.json").read_text())
    attempt(report, "read_repo_git", lambda: (run.parents[1] / ".git" / "HEAD").read_text())
    attempt(report, "write_run_dir", lambda: (run / "forged.json").write_text("{}"))
    attempt(report, "write_tmp", lambda: Path("/tmp/evolver-command-canary").write_text("x"))
    attempt(report, "read_real_home", lambda: os.listdir("/root"))
    attempt(report, "read_parent_environ", lambda: Path(f"/proc/{os.getppid()}/environ").read_bytes())
    tau2 = next((Path(p) / "tau2" for p in sys.path if (Path(p) / "tau2").is_dir()), None)
    attempt(report, "read_tau2_tasks", lambda: (tau2 / "data" / "tau2" / "domains" / "mock" / "tasks.json").read_text())
    report["env"] = sorted(os.environ)
    report["key"] = os.environ.get("OPENAI_API_KEY", "")
    attempt(report, "run_a_program", lambda: subprocess.run(["/bin/true"], check=True))
    Path("agent/link.md").symlink_to("/etc/passwd")
    os.mkfifo("agent/pipe.md")
    Path("report.json").write_text(json.dumps(report))


def sleep() -> None:
    subprocess.Popen(["sleep", "31338"])
    import time

    time.sleep(3600)


if __name__ == "__main__":
    {"honest": honest, "hostile": hostile, "sleep": sleep}[sys.argv[1]]()
