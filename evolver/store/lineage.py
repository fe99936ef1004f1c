"""Git lineage of a run: one branch and one commit per candidate, a `best` branch, notes.

The user's checked-out branch and working tree are never touched: candidates
are built in `git worktree`s, branches are created without checkout, and
scores/verdicts go into git notes (refs/notes/commits, so `git log` shows them).
"""

from __future__ import annotations

import functools
import shutil
import threading
import time
from pathlib import Path
from typing import Optional

import git

from evolver.errors import UsageError


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{path} is not a git repository; run `git init` there (evolver keeps candidates as git branches)") from None


def _serial(method):
    """One git call at a time: the candidates of an iteration share the repository, and neither
    git's worktree and ref locks nor gitpython's cat-file pipes take concurrent callers."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self.lock:
            return method(self, *args, **kwargs)

    return call


class Lineage:
    def __init__(self, repo_path: Path, run_id: str):
        self.repo = open_repo(repo_path)
        self.run_id = run_id
        self.prefix = f"evolver/{run_id}"
        self.lock = threading.RLock()

    # -- names -------------------------------------------------------------
    @property
    def best_branch(self) -> str:
        return f"{self.prefix}/best"

    def candidate_branch(self, slug: str) -> str:
        return f"{self.prefix}/iter-{slug}"

    # -- reading -----------------------------------------------------------
    @_serial
    def commit_of(self, ref: str) -> Optional[str]:
        try:
            return self.repo.commit(ref).hexsha
        except (git.BadName, ValueError):
            return None

    @_serial
    def agent_tree_of(self, commit: str) -> Optional[str]:
        """The hash of a commit's agent/ tree: equal hashes, equal agents."""
        try:
            return (self.repo.commit(commit).tree / "agent").hexsha
        except (git.BadName, ValueError, KeyError):
            return None

    @_serial
    def agent_files_at(self, commit: str) -> dict[str, bytes]:
        """Every file under a commit's agent/, by path from the repository's root; {} when it has none."""
        try:
            tree = self.repo.commit(commit).tree / "agent"
        except (git.BadName, ValueError, KeyError):
            return {}
        return {blob.path: blob.data_stream.read() for blob in tree.traverse() if blob.type == "blob"}

    @_serial
    def file_at(self, commit: str, path: str) -> Optional[str]:
        """A file's text as a commit holds it (agent/agent.py of the incumbent an analysis measured); None if it has none."""
        try:
            return (self.repo.commit(commit).tree / path).data_stream.read().decode("utf-8")
        except (git.BadName, ValueError, KeyError, UnicodeDecodeError):
            return None

    @_serial
    def diff(self, parent: str, child: str) -> str:
        return self.repo.git.diff(parent, child, "--", "agent")

    @_serial
    def is_dirty(self, path: str = "agent") -> bool:
        return bool(self.repo.git.status("--porcelain", "--", path).strip())

    # -- writing -----------------------------------------------------------
    def _env(self) -> dict:
        """An author identity for candidate commits when the repo has none configured."""
        reader = self.repo.config_reader()
        if reader.has_option("user", "name") and reader.has_option("user", "email"):
            return {}
        return {
            "GIT_AUTHOR_NAME": "evolver",
            "GIT_AUTHOR_EMAIL": "evolver@localhost",
            "GIT_COMMITTER_NAME": "evolver",
            "GIT_COMMITTER_EMAIL": "evolver@localhost",
        }

    @_serial
    def set_branch(self, name: str, commit: str) -> None:
        """Create or move a branch without checking anything out."""
        self.repo.git.branch("-f", name, commit)

    @_serial
    def clear_stale_locks(self, shared_wait: float = 2.0) -> list[str]:
        """Remove the lock files a run killed inside a git command left on refs, which make git refuse
        every later update of them ("cannot lock ref"); the names of those removed. Only the run's driver,
        holding the run's lock, may call this. The run's own branches are written by nobody else; the notes
        ref, shared with other runs and the user's git, counts as stale once its lock stays unchanged for
        ``shared_wait`` seconds, far longer than git holds one. (A run never deletes or packs refs, so a
        packed-refs.lock is never its own: a user's `git gc` may hold it.)"""
        common = Path(self.repo.common_dir)
        stale = sorted((common / "refs" / "heads" / self.prefix).glob("**/*.lock"))
        notes = common / "refs" / "notes" / "commits.lock"
        seen, deadline = _identity(notes), time.monotonic() + shared_wait
        while seen is not None and _identity(notes) == seen and time.monotonic() < deadline:
            time.sleep(0.1)
        if seen is not None and _identity(notes) == seen:
            stale.append(notes)
        removed = []
        for path in stale:
            try:
                path.unlink()
                removed.append(str(path.relative_to(common)))
            except FileNotFoundError:
                pass
        return removed

    @_serial
    def open_worktree(self, path: Path, commit: str) -> Path:
        """A detached worktree at `commit` (re-created if a crash left it half-made)."""
        path = Path(path)
        if path.exists():
            self.remove_worktree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Twice: git locks a worktree while it adds one ("initializing"), and a kill leaves the lock behind.
        self.repo.git.worktree("add", "--detach", "--force", "--force", str(path), commit)
        return path

    @_serial
    def remove_worktree(self, path: Path) -> None:
        if Path(path).exists():
            try:
                self.repo.git.worktree("remove", "--force", "--force", str(path))  # locked by a killed `add` too
            except git.GitCommandError:
                shutil.rmtree(path, ignore_errors=True)
        self.repo.git.worktree("prune")

    @_serial
    def commit_candidate(self, worktree: Path, branch: str, message: str) -> str:
        """Commit everything changed under agent/ in the worktree and point `branch` at it."""
        wt = git.Repo(worktree)
        wt.git.add("-A", "--", "agent")
        with wt.git.custom_environment(**self._env()):
            wt.git.commit("--no-verify", "--allow-empty", "-m", message)
        sha = wt.head.commit.hexsha
        self.set_branch(branch, sha)
        return sha

    @_serial
    def add_note(self, commit: str, text: str) -> None:
        with self.repo.git.custom_environment(**self._env()):
            self.repo.git.notes("add", "-f", "-m", text, commit)

    @_serial
    def note(self, commit: str) -> str:
        try:
            return self.repo.git.notes("show", commit)
        except git.GitCommandError:
            return ""


def _identity(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def exclude_runs_dir(repo_path: Path, folder: str = "runs") -> None:
    """Keep runs/ (or another folder evolver writes in the repository, such as mlruns/) out of
    `git status` in repos not set up by `evolver init`."""
    repo = open_repo(repo_path)
    info = Path(repo.git_dir) / "info"
    info.mkdir(exist_ok=True)
    exclude = info / "exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if f"{folder}/" not in lines and f"/{folder}/" not in lines:
        exclude.write_text("\n".join(lines + [f"/{folder}/"]) + "\n")


def commit_message(title: str, rationale: str, trailers: dict[str, str]) -> str:
    body = rationale.strip()
    trailer_text = "\n".join(f"{k}: {v}" for k, v in trailers.items())
    return f"{title.strip()}\n\n{body}\n\n{trailer_text}\n" if body else f"{title.strip()}\n\n{trailer_text}\n"
