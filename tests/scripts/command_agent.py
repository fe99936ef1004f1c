"""A stand-in for an external coding agent (tests/test_proposer.py), run by the command proposer in its
workspace. `honest`: reads TASK.md and the analysis files, fixes agent/agent.py, writes PROPOSAL.md.
`hostile`: tries everything it must not be able to do, writes what worked to report.json, and leaves a
symbolic link and a pipe in agent/ for the trusted side to trip over. `sleep`: starts a child and hangs.
`installed`: as installed by pip (the test builds a wheel of this file, with the console scripts
`planted-coder` = main and `planted-probe` = probe): runs `planted-probe` by name, then does what `honest` does.
`probe` writes probe.json: what of /etc, of the home in PLANTED_HOME and of root's powers the command reached.
"""

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


def evolver_environ() -> bytes:
    """The environment of the nearest ancestor outside the command's session: evolver's, with its keys."""
    pid = os.getppid()
    while os.getsid(pid) == os.getsid(0):
        pid = int(Path(f"/proc/{pid}/status").read_text().split("PPid:")[1].split()[0])
    return Path(f"/proc/{pid}/environ").read_bytes()


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
    attempt(report, "read_evolver_environ", evolver_environ)
    tau2 = next((Path(p) / "tau2" for p in sys.path if (Path(p) / "tau2").is_dir()), None)
    attempt(report, "read_tau2_tasks", lambda: (tau2 / "data" / "tau2" / "domains" / "mock" / "tasks.json").read_text())
    report["env"] = sorted(os.environ)
    report["key"] = os.environ.get("OPENAI_API_KEY", "")
    attempt(report, "run_a_program", lambda: subprocess.run(["/bin/true"], check=True))
    Path("agent/link.md").symlink_to("/etc/passwd")
    os.mkfifo("agent/pipe.md")
    Path("report.json").write_text(json.dumps(report))


def probe() -> None:
    import ctypes
    import pwd
    import socket
    import ssl

    home = Path(os.environ["PLANTED_HOME"])  # the home folder evolver runs with; the command's HOME is the workspace's
    Path("chown-me").write_text("x")

    def cap_sys_admin():
        return ctypes.CDLL(None).prctl(23, 21, 0, 0, 0)  # PR_CAPBSET_READ, CAP_SYS_ADMIN: 1 when held

    actions = {
        "/etc/shadow": lambda: Path("/etc/shadow").read_bytes(),
        "/etc/gshadow": lambda: Path("/etc/gshadow").read_bytes(),
        "/etc/sudoers": lambda: Path("/etc/sudoers").read_bytes(),
        "/etc/ssh": lambda: os.listdir("/etc/ssh"),
        "/etc/ssh/ssh_config": lambda: Path("/etc/ssh/ssh_config").read_bytes(),
        "/etc listing": lambda: os.listdir("/etc"),
        "/etc/ssl/private": lambda: os.listdir("/etc/ssl/private"),
        "home key": lambda: (home / ".ssh" / "id_ed25519").read_bytes(),
        "home listing": lambda: os.listdir(home),
        "home config": lambda: (home / ".config" / "gh" / "hosts.yml").read_bytes(),
        "home history": lambda: (home / ".bash_history").read_bytes(),
        "certificates": lambda: len(os.listdir("/etc/ssl/certs")) and ssl.create_default_context().cert_store_stats()["x509_ca"],
        "passwd entry": lambda: pwd.getpwuid(os.getuid()).pw_name,
        "localhost": lambda: socket.getaddrinfo("localhost", 80)[0][4][0],
        "chown": lambda: os.chown("chown-me", 4242, 4242),
        "cap_sys_admin": cap_sys_admin,
    }
    report = {}
    for name, action in actions.items():
        try:
            report[name] = f"ok: {action()}"[:60]
        except OSError as exc:
            report[name] = type(exc).__name__
    report["env"] = sorted(os.environ)
    Path("probe.json").write_text(json.dumps(report))


def installed() -> None:
    subprocess.run(["planted-probe"], check=True)  # installed beside evolver, not in the user's PATH
    honest()


def sleep() -> None:
    print("waiting for the model", flush=True)
    subprocess.Popen(["sleep", sys.argv[2] if len(sys.argv) > 2 else "31338"])
    import time

    time.sleep(3600)


def main() -> None:
    {"honest": honest, "hostile": hostile, "sleep": sleep, "installed": installed, "probe": probe}[sys.argv[1]]()


if __name__ == "__main__":
    main()
