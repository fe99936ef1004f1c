"""Where the program of a command line is installed: the folders a confined command (command_sandbox.confine_command)
needs in its PATH and may read to run it, and the places it is never given (your home, the workspace's
surroundings, where keys live).

Coding agents are installed the way their makers say: a console script of pip, pipx or uv (a script whose
first line names the Python of a virtual environment), a global npm package (a link in a bin folder to a
script run by `node`: under /usr/local, ~/.npm-global, or nvm's ~/.nvm/versions/node/X), or a native
binary (Claude Code's, linked from ~/.local/bin). So the program is followed from where it is found
(your PATH, then the bin folder of the Python evolver runs in) through its links and the interpreter its
first line names, a few steps deep; each step's folder is granted, and beside a folder named `bin` the
installation's `lib`, `lib64` and `pyvenv.cfg` (its packages, and what makes a Python a virtual environment),
beside a folder named `shims` the version manager that owns it (pyenv's ~/.pyenv).
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# Where keys and private settings live in a home folder: never granted, nor any folder that holds one.
KEY_PLACES = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".gitconfig",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".my.cnf",
    ".vault-token",
    ".password-store",
    ".local/share/keyrings",
    ".m2",
    ".codex",
    ".claude.json",
    ".claude/.credentials.json",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".terraform.d",
    ".bash_history",
    ".zsh_history",
    ".python_history",
    ".node_repl_history",
    ".psql_history",
    ".mysql_history",
    ".lesshst",
    ".viminfo",
)
# Words of the shell itself: a command line that starts with one names no program to find.
SHELL_WORDS = frozenset(
    ". : [ alias bg break cd command continue eval exec exit export false fg getopts hash jobs kill pwd "
    "read readonly return set shift test times trap true type ulimit umask unalias unset wait echo printf "
    "local if then else elif fi case esac for while until do done { } ! ( )".split()
)
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
STEPS = 4  # links and interpreter lines followed: script -> venv python -> base python is 3


@dataclass(frozen=True)
class ProgramFolders:
    """What a command needs to run its program: where it was found, the folders to search first for it and its
    interpreter, and what it may read; ``kept_out`` the folders it runs from that hold a place it is never given."""

    program: Path | None
    search: tuple[Path, ...] = ()
    readable: tuple[Path, ...] = ()
    kept_out: tuple[tuple[Path, str], ...] = ()


def environment_bin() -> Path:
    """The bin folder of the Python environment evolver runs in (where `pip install` puts a console script)."""
    return Path(sys.prefix) / "bin"


def installed_bins(readable: tuple[str, ...] = ()) -> list[Path]:
    """Where a command finds programs installed for it: the bin folder of evolver's environment (a CLI installed
    beside evolver, whether or not the environment is active), the --proposer-read folders and their bin folders."""
    folders = [Path(os.path.abspath(r)) for r in readable]  # the command's PATH is read in its workspace
    return _unique([environment_bin(), *(q for r in folders for q in (r / "bin", r))])


def search_path(readable: tuple[str, ...] = ()) -> list[Path]:
    """Where the command's program is looked for: your PATH first (what you get when you type its name), then
    ``installed_bins``."""
    yours = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(p)]
    return _unique([*yours, *installed_bins(readable)])


def first_word(command: str) -> str | None:
    """The program a shell command line runs first (after variable assignments); None when the line starts
    with a word of the shell itself or with anything the shell would expand."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return None
    for word in words:
        if ASSIGNMENT.fullmatch(word):
            continue
        if word in SHELL_WORDS or any(c in word for c in "$`*?[]~(){};|&<>"):
            return None
        return word
    return None


def locate(word: str, path: list[Path]) -> Path | None:
    """The executable file a word names: a full path as given, a name looked up in ``path`` (a relative path
    would be relative to the workspace, where nothing is installed: not looked up)."""
    if "/" in word:
        return Path(word) if os.path.isabs(word) and os.path.isfile(word) and os.access(word, os.X_OK) else None
    found = shutil.which(word, path=os.pathsep.join(map(str, path)))
    return Path(found) if found else None


def program_folders(command: str, path: list[Path], keep_out: tuple[Path, ...]) -> ProgramFolders:
    """The folders of the command's first program, followed through its links and interpreter lines; none that
    is or holds a place in ``keep_out`` or a key place (see ``exposed``)."""
    word = first_word(command)
    program = locate(word, path) if word else None
    if program is None:
        return ProgramFolders(program=None)
    search, folders = [program.parent], []
    step: Path | None = program
    for _ in range(STEPS):
        if step is None:
            break
        real = step.resolve()
        folders += [step.parent, real.parent]
        interpreter, looked_up = _interpreter(real, path)
        if looked_up and interpreter is not None:
            search.append(interpreter.parent)  # `#!/usr/bin/env node`: the command's own PATH must find the same node
        step = interpreter
    readable, kept_out = [], []
    for folder in _unique(folders):
        for grant in (folder, *_beside(folder)):
            if not os.path.lexists(grant):
                continue
            why = exposed(grant, keep_out)
            if why:
                kept_out.append((grant, why))
            else:
                readable.append(grant)
    allowed = set(readable)
    return ProgramFolders(
        program=program, search=tuple(f for f in _unique(search) if f in allowed), readable=tuple(readable), kept_out=tuple(kept_out)
    )


def command_problem(command: str, readable: tuple[str, ...], repo: Path) -> str | None:
    """What would keep the command from running, or hand it more than its workspace, said in one line for the
    user before anything is spent; None when nothing does."""
    for folder in readable:
        why = exposed(Path(folder), (repo,))
        if why:
            return f"--proposer-read {folder}: {why}; name the folder its program is installed in instead"
    word = first_word(command)
    if word is None:
        return None
    if "/" in word and not os.path.isabs(word):
        return f"--proposer-command: {word} is a relative path, and the command runs in its own workspace; give its full path"
    program = locate(word, search_path(readable))
    if program is None:
        return (
            f"--proposer-command: {word} is not installed: not in your PATH, in {environment_bin()} or a --proposer-read "
            "folder; install it, or give its full path"
        )
    folder = program.resolve().parent
    why = exposed(folder, (repo,))
    if why:
        return f"--proposer-command: {program} runs from {folder}, which the command may not read ({why}); install it elsewhere"
    return None


def homes() -> tuple[Path, ...]:
    """Your home folder, by HOME and by the password database (they can differ, as under sudo)."""
    found = [Path.home()]
    try:
        found.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return _unique(found)


def exposed(folder: Path, keep_out: tuple[Path, ...] = ()) -> str | None:
    """What granting ``folder`` would hand over, or None: your home or ``keep_out`` (a folder holding the workspace
    holds the run directory and the repository), a place where keys live, or a folder holding one."""
    real = Path(os.path.abspath(folder)).resolve()
    for home in homes():
        if real == home.resolve() or real in home.resolve().parents:
            return f"it {'is' if real == home.resolve() else 'holds'} your home folder {home}, where keys live"
    for place in keep_out:
        if real == place.resolve() or real in place.resolve().parents:
            return f"it holds {place}"
    for home in homes():
        for name in KEY_PLACES:
            key = home / name
            if os.path.lexists(key) and (real == key.resolve() or real in key.resolve().parents or key.resolve() in real.parents):
                return f"it would reach {key}, where keys or private settings live"
    return None


def _beside(folder: Path) -> tuple[Path, ...]:
    """What an installation keeps beside the folder of its programs: next to `bin`, its packages and what makes it a
    virtual environment; next to `shims` (pyenv, rbenv, asdf), the version manager itself, which the shims run."""
    if folder.name == "bin":
        return tuple(folder.parent / name for name in ("lib", "lib64", "pyvenv.cfg"))
    return (folder.parent,) if folder.name == "shims" else ()


def _interpreter(program: Path, path: list[Path]) -> tuple[Path | None, bool]:
    """The interpreter a script's first line names, and whether it was looked up by name (`#!/usr/bin/env node`)."""
    try:
        with open(program, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None, False
    if not head.startswith(b"#!"):
        return None, False
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None, False
    if Path(words[0]).name != "env":
        return Path(words[0]), False
    names = [w for w in words[1:] if not w.startswith("-") and not ASSIGNMENT.fullmatch(w)]  # `env -S node --flag`
    return (locate(names[0], path), True) if names else (None, False)


def _unique(paths) -> list[Path]:
    return list(dict.fromkeys(Path(p) for p in paths))
