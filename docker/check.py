"""Check evolver's container image end to end, with no image registry: build it with podman on a Debian
base made by debootstrap, run the README's main command and the hostile-patch table (benchmarks/chaos.py)
inside it, and check that the sandbox held, nothing hostile was kept and nothing escaped the mounted
repository.

    python3 docker/check.py [--extras local-small] [--seccomp-profile docker-default.json] [--work DIR] [--keep]

Needs Linux, root, podman with runc, and debootstrap (Debian: apt-get install podman runc debootstrap);
reaches only the Debian mirror and PyPI. The main command evolves a clone of this repository's HEAD
(commit first: uncommitted changes are not in it), mounted at /repo and owned by uid 1000, as a host
user's would be. --extras local-small builds the 0.5B model instead of the 1.5B and runs the command
with --local-size small, to save time. --seccomp-profile repeats the sandbox probe and the hostile-patch
table under another runtime's profile (Docker's default.json, say) instead of podman's.
Slow (tens of minutes on 2 cores): not part of the test suite. Exit 0 when every check passed, 1 when
one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "localhost/evolver-check-base:bookworm"
IMAGE = "localhost/evolver:check"
MIRROR = "http://deb.debian.org/debian"
MAIN = ["run", "--iterations", "2", "--candidates", "1", "--max-steps", "12"]  # the README's main command
USER_ID = 1000  # the image's user (docker/Dockerfile)
# With cgroup v1, all of podman's containers share one cpu cgroup (libpod_parent), which weighs as much as a single
# process of the host's: on a busy machine the embedded model then got a sliver of a core (0.5-1 token/s). At the
# top, with four processes' weight (the model's two threads, evolver, an agent process), the container gets what
# the same command would get run on the host.
RUN_OPTS = ["--cgroup-parent=/", "--cpu-shares", "4096"]
CHAOS_SUMMARY = {  # the lines benchmarks/chaos.py ends with
    "hostile": r"hostile patches tried (\d+) / refused by the scan (\d+) / neutralised by the sandbox with the scan skipped (\d+) / kept (\d+)",
    "scan": r"task data copied into the harness \(only the scan can catch it\) tried (\d+) / refused (\d+)",
    "valid": r"valid patches wrongly refused (\d+) of (\d+) \(must be 0\); scored like the honest agent (\d+) of (\d+)",
    "faults": r"faults tried (\d+) / scored as candidate failure (\d+)",
}


class Check:
    def __init__(self, work: Path, keep: bool):
        self.work, self.keep = work, keep
        self.logs = work / "logs"
        self.failures: list[str] = []
        self.started = time.monotonic()

    def env(self) -> dict:
        """podman with its storage, settings and temporary files in the work folder, nothing in /etc changed."""
        return {
            **os.environ,
            "CONTAINERS_CONF": str(self.work / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.work / "storage.conf"),
            "TMPDIR": str(self.work / "tmp"),
        }

    def podman(self, *args: str, log: str = "", check: bool = True, timeout: float = 7200) -> subprocess.CompletedProcess:
        """Run podman; with ``log``, its output goes to logs/<log> and is returned too."""
        proc = subprocess.run(["podman", *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if log:
            (self.logs / log).write_text(proc.stdout + proc.stderr)
        if check and proc.returncode != 0:
            where = f"; see {self.logs / log}" if log else ""
            raise SystemExit(
                f"podman {args[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}{where}"
            )
        return proc

    def step(self, text: str) -> float:
        print(f"[{time.monotonic() - self.started:7.0f} s] {text}", flush=True)
        return time.monotonic()

    def expect(self, ok: bool, what: str) -> None:
        print(f"    {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            self.failures.append(what)

    def configure(self) -> None:
        for sub in ("logs", "tmp"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        # runc, as crun refuses a kernel with hybrid cgroups; cgroupfs and file events, as no systemd may run here.
        # Limits no higher than this process's own: a runtime without CAP_SYS_RESOURCE cannot raise them, and
        # runc here could not set 4096+ processes either (it fails to start the container otherwise).
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])
        (self.work / "containers.conf").write_text(
            f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
            '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        )
        (self.work / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{self.work / "storage"}"\nrunroot = "{self.work / "runroot"}"\n'
        )

    def base(self) -> None:
        if self.podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
            self.step(f"base image {BASE_IMAGE} already built")
            return
        t = self.step(f"debootstrap: Debian bookworm with Python 3.11 from {MIRROR}")
        rootfs = self.work / "rootfs"
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", str(rootfs), MIRROR],
            capture_output=True,
            text=True,
        )
        (self.logs / "debootstrap.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(f"debootstrap failed ({proc.returncode}); see {self.logs / 'debootstrap.log'}")
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "-", BASE_IMAGE], stdin=tar.stdout, env=self.env(), capture_output=True, text=True)
        tar.wait()
        shutil.rmtree(rootfs)
        if imported.returncode != 0 or tar.returncode != 0:
            raise SystemExit(f"podman import failed: {imported.stderr.strip()[-300:]}")
        print(f"    {time.monotonic() - t:.0f} s", flush=True)

    def build(self, extras: str, ca_bundle: str) -> None:
        t = self.step(f"podman build -f docker/Dockerfile (EXTRAS={extras}, BASE={BASE_IMAGE})")
        args = [
            "build",
            "--pull=never",
            "-f",
            str(ROOT / "docker" / "Dockerfile"),
            "--build-arg",
            f"BASE={BASE_IMAGE}",
            "--build-arg",
            f"EXTRAS={extras}",
            "-t",
            IMAGE,
        ]
        if ca_bundle:  # mounted for the build's steps only; the image keeps no copy of it
            args += ["-v", f"{ca_bundle}:/run/evolver-build-ca.crt:ro", "--build-arg", "CA_BUNDLE=/run/evolver-build-ca.crt"]
        self.podman(*args, str(ROOT), log="build.log")
        self.podman("image", "prune", "-f")  # the layers a source change replaced
        size = self.podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip()
        print(f"    {time.monotonic() - t:.0f} s, image {int(size) / 1e9:.2f} GB", flush=True)
        user = self.podman("image", "inspect", IMAGE, "--format", "{{.Config.User}}").stdout.strip()
        self.expect(user not in ("", "root", "0"), f"the image runs as a user of its own, not root (User: {user!r})")

    def probe(self, seccomp: str) -> dict:
        """The sandbox confining a forked process inside the container, and what that process could still reach."""
        opts = ["--security-opt", f"seccomp={seccomp}"] if seccomp else []
        proc = self.podman(
            "run",
            "--rm",
            *RUN_OPTS,
            *opts,
            "--workdir",
            "/opt/evolver",
            "--entrypoint",
            "sh",
            IMAGE,
            "-c",
            "mkdir -p /tmp/probe && python -m tests.scripts.confine_probe mount /tmp/probe",
            log=f"probe{'-' + Path(seccomp).stem if seccomp else ''}.log",
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        out = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
        iso, p = out.get("isolation", {}), out.get("probes", {})
        print(f"    isolation: {json.dumps({k: v for k, v in iso.items() if k != 'limits'})}", flush=True)
        self.expect(
            iso.get("mode") == "sandbox" and iso.get("seccomp") is True and (iso.get("landlock_abi") or 0) >= 1,
            "Landlock and seccomp confine the agent process inside the container",
        )
        self.expect(
            p.get("tau2 tasks.json") in ("FileNotFoundError", "PermissionError")
            and p.get("home listing") == "PermissionError"
            and p.get("etc passwd") == "PermissionError",
            "tau2's task data, the home folder and /etc/passwd stay out of its reach",
        )
        if not iso.get("namespaces"):
            self.expect(bool(iso.get("namespaces_refused")), f"without namespaces, result.json says why: {iso.get('namespaces_refused')}")
        return iso

    def main_command(self, size: str) -> None:
        host = self.work / "host"  # the folder that holds the repository, as a user's home would
        shutil.rmtree(host, ignore_errors=True)
        repo = host / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        subprocess.run(["chown", "-R", f"{USER_ID}:{USER_ID}", str(host)], check=True)
        sentinel = host / "beside-the-repository.txt"
        sentinel.write_text("nothing in the container may touch this\n")
        beside = sorted(p.name for p in host.iterdir())
        before = self._git_state(repo)
        command = [*MAIN, *(["--local-size", size] if size != "default" else [])]
        t = self.step(f"inside the container: evolver {' '.join(command)} (the repository mounted at /repo)")
        proc = self.podman("run", "--rm", "--init", *RUN_OPTS, "-v", f"{repo}:/repo", IMAGE, *command, log="main.log", check=False)
        minutes = (time.monotonic() - t) / 60
        print("    " + "\n    ".join(proc.stdout.strip().splitlines()[-12:]), flush=True)
        self.expect(
            proc.returncode == 0, f"the main command exited 0 in {minutes:.1f} min (exit {proc.returncode}; {self.logs / 'main.log'})"
        )
        results = sorted(
            p for p in (repo / "runs").rglob("result*.json") if re.fullmatch(r"result(-\d+)?\.json", p.name)
        )  # result-<T>.json in a run
        isolations = {
            json.dumps(
                {k: v for k, v in json.loads(r.read_text()).get("isolation", {}).items() if k not in ("limits", "readable_paths")},
                sort_keys=True,
            )
            for r in results
        }
        print(f"    {len(results)} result.json files; isolation recorded: {sorted(isolations)}", flush=True)
        sandboxed = [json.loads(i) for i in isolations]
        self.expect(
            bool(results)
            and all(i.get("mode") == "sandbox" and i.get("seccomp") is True and (i.get("landlock_abi") or 0) >= 1 for i in sandboxed),
            "every evaluation of the run was sandboxed (result.json's isolation)",
        )
        after = self._git_state(repo)
        self.expect(
            after["head"] == before["head"] and after["branch"] == before["branch"], "the checked-out branch and its commit are unchanged"
        )
        self.expect(after["status"] == before["status"] == "", "the working tree is unchanged (git status is clean; runs/ is ignored)")
        new_refs = sorted(set(after["refs"]) - set(before["refs"]))
        self.expect(
            all(r.startswith(("refs/heads/evolver/", "refs/notes/")) for r in new_refs),
            f"new refs are the run's own only ({len(new_refs)}: {', '.join(new_refs[:4])}{' ...' if len(new_refs) > 4 else ''})",
        )
        foreign = [str(p.relative_to(repo)) for p in repo.rglob("*") if p.lstat().st_uid != USER_ID]
        self.expect(not foreign, f"everything in the repository belongs to the container's user ({foreign[:3]})")
        self.expect(
            sorted(p.name for p in host.iterdir()) == beside and sentinel.read_text().startswith("nothing"),
            "nothing appeared or changed beside the mounted repository",
        )

    @staticmethod
    def _git_state(repo: Path) -> dict:
        def git(*args: str) -> str:  # --no-optional-locks: a status run as root here must not rewrite the index as root
            return subprocess.run(
                ["git", "--no-optional-locks", "-c", "safe.directory=*", "-C", str(repo), *args], capture_output=True, text=True, check=True
            ).stdout.strip()

        return {
            "head": git("rev-parse", "HEAD"),
            "branch": git("symbolic-ref", "HEAD"),
            "status": git("status", "--porcelain"),
            "refs": git("for-each-ref", "--format=%(refname)").splitlines(),
        }

    def chaos(self, seccomp: str) -> None:
        opts = ["--security-opt", f"seccomp={seccomp}"] if seccomp else []
        name = f"chaos{'-' + Path(seccomp).stem if seccomp else ''}.log"
        t = self.step(f"inside the container: python benchmarks/chaos.py{' under ' + seccomp if seccomp else ''}")
        proc = self.podman(
            "run",
            "--rm",
            "--init",
            *RUN_OPTS,
            *opts,
            "--workdir",
            "/opt/evolver",
            "--entrypoint",
            "python",
            IMAGE,
            "benchmarks/chaos.py",
            log=name,
            check=False,
        )
        found = {key: re.search(pattern, proc.stdout) for key, pattern in CHAOS_SUMMARY.items()}
        print("    " + "\n    ".join(m.group(0) for m in found.values() if m) + f"\n    ({time.monotonic() - t:.0f} s)", flush=True)
        self.expect(
            proc.returncode == 0 and all(found.values()), f"chaos.py ran to its summary (exit {proc.returncode}; {self.logs / name})"
        )
        if all(found.values()):
            tried, _, _, kept = map(int, found["hostile"].groups())
            self.expect(tried > 0 and kept == 0, f"hostile patches kept: {kept} of {tried}")
            copied, refused = map(int, found["scan"].groups())
            self.expect(copied == refused, f"task data copied into the harness: {refused} of {copied} refused by the scan")
            wrongly, valid, scored, _ = map(int, found["valid"].groups())
            self.expect(
                wrongly == 0 and scored == valid, f"valid patches: {wrongly} refused, {scored} of {valid} scored like the honest agent"
            )
            faults, failures = map(int, found["faults"].groups())
            self.expect(faults == failures, f"faults: {failures} of {faults} scored as the candidate's failure")

    def cleanup(self) -> None:
        leftover = self.podman("ps", "-aq", check=False).stdout.split()
        if leftover:
            self.podman("rm", "-f", *leftover, check=False)
        if self.keep:
            print(f"kept {self.work} (images in its storage: rerun with --work {self.work} to reuse them)")
            return
        self.podman("system", "reset", "-f", check=False)  # unmounts and removes the storage's layers
        shutil.rmtree(self.work, ignore_errors=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/evolver-container-check"), help="storage, logs and the cloned repository")
    ap.add_argument(
        "--extras",
        choices=("local", "local-small"),
        default="local",
        help="the embedded model to build in: local (1.5B, the README's) or local-small (0.5B, faster)",
    )
    ap.add_argument("--seccomp-profile", default="", help="also probe the sandbox and run chaos.py under this seccomp profile")
    ap.add_argument(
        "--ca-bundle",
        default=next((os.environ[v] for v in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE") if os.environ.get(v)), ""),
        help="a CA bundle for pip during the build, where a proxy re-signs TLS (default: $PIP_CERT, $REQUESTS_CA_BUNDLE or $SSL_CERT_FILE)",
    )
    ap.add_argument("--skip-main", action="store_true", help="skip the main command (the probe and chaos.py only)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and its images for a rerun")
    return ap.parse_args(argv)


def bad_input(args: argparse.Namespace) -> str:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "this check needs Linux and root (debootstrap and a rootful podman)"
    missing = [tool for tool in ("podman", "runc", "debootstrap", "git") if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)}; on Debian: apt-get install -y podman runc debootstrap git"
    for flag, path in (("--seccomp-profile", args.seccomp_profile), ("--ca-bundle", args.ca_bundle)):
        if path and not Path(path).is_file():
            return f"{flag} {path}: no such file"
    if args.seccomp_profile:
        try:
            json.loads(Path(args.seccomp_profile).read_text())["syscalls"]
        except (ValueError, KeyError, TypeError):
            return f"--seccomp-profile {args.seccomp_profile}: not a seccomp profile (JSON with a 'syscalls' list)"
    return ""


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    problem = bad_input(args)
    if problem:
        print(f"check.py: {problem}", file=sys.stderr)
        return 2
    check = Check(args.work.resolve(), args.keep)
    check.configure()
    try:
        check.base()
        check.build(args.extras, args.ca_bundle)
        check.step("the sandbox inside the container, under podman's default seccomp profile")
        check.probe("")
        if not args.skip_main:
            check.main_command("small" if args.extras == "local-small" else "default")
        check.chaos("")
        if args.seccomp_profile:
            check.step(f"the sandbox inside the container, under {args.seccomp_profile}")
            check.probe(args.seccomp_profile)
            check.chaos(args.seccomp_profile)
    except SystemExit as exc:
        check.failures.append(str(exc))
        print(f"    FAIL {exc}", flush=True)
    finally:
        check.cleanup()
    total = (time.monotonic() - check.started) / 60
    if check.failures:
        print(f"{len(check.failures)} check(s) failed in {total:.1f} min:\n  " + "\n  ".join(check.failures))
        return 1
    print(f"every check passed in {total:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
