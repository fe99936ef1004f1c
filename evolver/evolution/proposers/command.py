"""The command proposer: an external coding agent (Codex CLI, Claude Code, aider, a script of yours)
edits a copy of agent/ in a workspace that holds only what the meta-LLM may see.

The workspace (the proposal's folder in the run directory, `workspace/`):

    TASK.md          what to do, and what is off limits (prompts/command/task.md)
    Harness.md       the guide
    agent/           a copy of the parent's agent/: edit it
    analysis/        failures.md, and per analysis simulation its conversation and its turns as the model saw
                     them, with what the harness changed (masked, like the digest)
    candidates/      the run's earlier candidates: verdict, the gate tasks they flipped, diff
    learnings.md     what earlier iterations found
    PROPOSAL.md      written by the command, optional: "TITLE: ..." and "RATIONALE: ..." lines

The command runs there confined (evolver.evaluation.command_sandbox.confine_command): it reads the system's
programs and libraries, the /etc entries programs need, the folders its program is installed in
(evolver.evaluation.program_folders: found by name as you would find it) and the folders you name,
reads and writes the workspace only, with no capability even as root, with an environment that holds
only the variables you name (its own API key), and is stopped at the time limit with everything it
started. What it leaves in workspace/agent/ is hostile input: read without following links, and
checked edit by edit (evolver.evolution.scratch) like every other proposal.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Optional

from evolver.evaluation.program_folders import ProgramFolders, command_problem, exposed, installed_bins, program_folders, search_path
from evolver.evaluation.scan import in_baseline
from evolver.evolution.evidence import Evidence
from evolver.evolution.noop import agent_files
from evolver.evolution.patch import Proposal
from evolver.evolution.proposers import ProposalResult, Proposer, Request
from evolver.evolution.proposers.prompts import Prompts
from evolver.evolution.scratch import Scratch

MAX_FILE = 200_000  # bytes of one file the command leaves in agent/
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
LOG_TAIL = 2000


class CommandProposer(Proposer):
    name = "command"

    def __init__(self, command: str, env_names: tuple[str, ...] = (), readable: tuple[str, ...] = ()):
        self.command, self.env_names, self.readable = command, tuple(env_names), tuple(readable)

    @classmethod
    def from_config(cls, cfg) -> "CommandProposer":
        return cls(cfg.proposer_command, env_names=tuple(cfg.proposer_env), readable=tuple(cfg.proposer_read))

    @classmethod
    def meta_shape(cls, meta) -> None:
        return None  # the command calls its own model, which evolver never sees

    @classmethod
    def meta_tokens(cls, cfg, one_request: int) -> tuple[int, int]:
        return 0, 0

    @classmethod
    def problem(cls, cfg, repo: Path) -> Optional[str]:
        if not cfg.proposer_command.strip():
            return "--proposer command needs --proposer-command, the command line of the coding agent to run (see `evolver run --help`)"
        return command_problem(cfg.proposer_command, tuple(cfg.proposer_read), repo)

    def propose(self, request: Request) -> ProposalResult:
        workspace = request.workdir / "workspace"
        prepare_workspace(request, workspace)
        request.progress(1, 1, "running the command")
        started = time.monotonic()
        program = program_folders(self.command, search_path(self.readable), keep_out=(workspace,))
        code, log = self.run(workspace, request.budget.seconds, program)
        (request.workdir / "command.log").write_text(log)
        stats = {
            "command": self.command,
            "program": str(program.program or "not found"),
            "exit_code": code,
            "seconds": round(time.monotonic() - started, 1),
            "log": str(request.workdir / "command.log"),
        }
        if program.kept_out:
            stats["kept_out"] = [f"{folder}: {why}" for folder, why in program.kept_out]
        if code is None:
            stats["stopped"] = f"stopped at the time limit ({request.budget.seconds:g} s)"
        outcome = take_patch(request, workspace)
        outcome.stats = {**stats, **outcome.stats}
        return outcome

    def run(self, workspace: Path, seconds: float, program: ProgramFolders) -> tuple[int | None, str]:
        """The command, confined, in the workspace, with its program's folders; its exit code (None when it ran out
        of time) and the end of its output."""
        from evolver.evaluation.command_sandbox import command_grants, confine_command

        named = tuple(r for r in self.readable if not exposed(Path(r), (workspace,)))  # refused at start; a backstop here
        readable, listable = command_grants((*program.readable, *named))
        home, tmp = workspace / ".home", workspace / ".tmp"
        home.mkdir(exist_ok=True)
        tmp.mkdir(exist_ok=True)
        env = command_environment(self.env_names, home, tmp, [*program.search, *installed_bins(named)])
        cpu = max(1, int(seconds * 2))
        proc = subprocess.Popen(
            ["/bin/sh", "-c", self.command],
            cwd=workspace,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: confine_command(readable, listable, workspace, cpu),
        )
        code, out = None, b""
        try:
            out, _ = proc.communicate(timeout=seconds)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:
                out, _ = proc.communicate(timeout=5)  # what it wrote before the limit: why it took so long
            except subprocess.TimeoutExpired:  # something that left its group holds the pipe
                pass
        finally:
            _kill_group(proc)
            if proc.poll() is None:
                proc.wait()
        return code, (out or b"").decode("utf-8", "replace")[-LOG_TAIL:]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever it started goes with it
    except ProcessLookupError:
        pass


def command_environment(names: tuple[str, ...], home: Path, tmp: Path, search: list[Path]) -> dict[str, str]:
    """All the command gets of evolver's environment: ``search`` then the system's folders as PATH, a HOME and
    TMPDIR in the workspace, the language and terminal settings, and the variables named (its own API key)."""
    env = {"PATH": os.pathsep.join(dict.fromkeys([*map(str, search), BASE_PATH])), "HOME": str(home), "TMPDIR": str(tmp)}
    env.update({k: v for k, v in os.environ.items() if k in ("LANG", "TERM") or k.startswith("LC_")})
    env.setdefault("LANG", "C.UTF-8")
    env.update({name: os.environ[name] for name in names if name in os.environ})
    return env


def prepare_workspace(request: Request, workspace: Path) -> None:
    if workspace.exists():
        shutil.rmtree(workspace)
    workspace.mkdir(parents=True)
    shutil.copytree(request.parent / "agent", workspace / "agent", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    prompts = Prompts("command", request.prompts_dir)
    i, k = request.focus
    focus = prompts.short("focus", number=i + 1, count=k) if k > 1 else ""
    (workspace / "TASK.md").write_text(prompts.text("task", focus=focus))
    (workspace / "Harness.md").write_text(request.guide)
    (workspace / "learnings.md").write_text("\n".join(request.learnings) or prompts.short("no_learnings"))
    write_evidence(request.evidence, workspace)
    write_turn_views(request.evidence, workspace / "analysis")


def write_evidence(evidence: Evidence, workspace: Path) -> None:
    """The analysis simulations and the earlier candidates as files, in full (no pages: a coding agent reads files)."""
    analysis, earlier = workspace / "analysis", workspace / "candidates"
    analysis.mkdir()
    earlier.mkdir()
    failures = [evidence.summary_line(r) for r in evidence.analysis.simulations if r.outcome != "infra_error" and (r.reward or 0.0) < 1.0]
    overview = evidence.harness_overview(tools=False)  # where to look first, as the other proposers are told, as places in the files
    (analysis / "failures.md").write_text(
        "\n".join(([overview, ""] if overview and failures else []) + failures) or "No failures on the analysis set.\n"
    )
    for record in evidence.analysis.simulations:
        if record.outcome == "infra_error":
            continue
        label = evidence.labels[record.task_id]
        text = "\n".join([evidence.summary_line(record), "", *evidence.described(record).transcript])
        (analysis / f"{label}-trial{record.trial}.md").write_text(text + "\n")
    for c in evidence.earlier:
        (earlier / f"{c.label}.md").write_text(
            f"# {c.label}: {c.title}\n\nverdict: {c.status}: {c.reason}\n"
            f"gate tasks that flipped: {', '.join(c.flips) or 'none'}\n\n```diff\n{c.diff}\n```\n"
        )


def write_turn_views(evidence: Evidence, analysis: Path) -> None:
    """Each analysis simulation turn by turn, as the model saw it and with the harness's changes (masked)."""
    for record in evidence.analysis.simulations:
        lines = evidence.turns_text(record) if record.outcome != "infra_error" else []
        if lines:
            (analysis / f"{evidence.labels[record.task_id]}-trial{record.trial}.turns.md").write_text("\n".join(lines))


def take_patch(request: Request, workspace: Path) -> ProposalResult:
    """The difference between the workspace's agent/ and the parent's, applied edit by edit to a scratch copy
    through the same checks as every proposal; read without following links, regular files only."""
    scratch = Scratch(request.parent, request.workdir / "scratch", request.identifiers, request.guide)
    parent = agent_files(request.parent)
    left, problems = _regular_files(workspace / "agent", workspace)
    for rel in sorted(parent):
        if rel not in left and not in_baseline(rel):
            problems.append(f"{rel} was removed: deletions are not taken")
    answers = []
    for rel, data in sorted(left.items()):
        if parent.get(rel, _read_bytes(request.parent / rel)) == data:  # agent/templates/ too, left as it was
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{rel} is not UTF-8 text")
            continue
        answer = scratch.write(rel, text)
        if not answer.startswith("applied"):
            problems.append(f"{rel}: {answer}")
        answers.append(answer)
    title, rationale = _proposal_text(workspace / "PROPOSAL.md")
    stats = {"changed": scratch.changed(), "problems": problems}
    if problems:
        return ProposalResult(
            proposal=Proposal(title=title, rationale=rationale, edits=scratch.edits()), refused=problems[0], errors=problems, stats=stats
        )
    why = scratch.problem()
    if why:
        return ProposalResult(proposal=None, errors=[f"no usable change: {why}"], stats=stats)
    return ProposalResult(proposal=Proposal(title=title, rationale=rationale, edits=scratch.edits()), stats=stats)


def _regular_files(base: Path, workspace: Path) -> tuple[dict[str, bytes], list[str]]:
    """Every regular file under base, by path from the workspace; links, pipes and devices are named, never opened."""
    files, problems = {}, []
    for folder, dirs, names in os.walk(base, followlinks=False):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            rel = path.relative_to(workspace).as_posix()
            if "__pycache__" in path.parts:
                continue
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                problems.append(f"{rel} is a symbolic link: refused")
            elif stat.S_ISDIR(info.st_mode):
                continue
            elif not stat.S_ISREG(info.st_mode):
                problems.append(f"{rel} is not a regular file: refused")
            elif info.st_size > MAX_FILE:
                problems.append(f"{rel} is larger than {MAX_FILE:,} bytes: refused")
            else:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as fh:
                    files[rel] = fh.read(MAX_FILE + 1)
        dirs[:] = [d for d in dirs if not os.path.islink(Path(folder) / d)]
    return files, problems


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _proposal_text(path: Path) -> tuple[str, str]:
    """TITLE and RATIONALE from PROPOSAL.md, if the command wrote one (a regular file, read without following links)."""
    title, rationale = "Proposal of an external coding agent", ""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return title, rationale
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(20_000).decode("utf-8", "replace")
    except OSError:
        return title, rationale
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().strip("*#").upper() == "TITLE" and value.strip():
            title = value.strip()[:200]
        elif key.strip().strip("*#").upper() == "RATIONALE" and value.strip():
            rationale = value.strip()[:4000]
    return title, rationale
