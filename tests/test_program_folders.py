"""Where a command proposer's program is installed, followed as people install coding agents (an npm global under
nvm, a pipx console script, Claude Code's native binary), and what is never granted: the home folder, places where
keys live, a folder holding the repository. Plain files in a fake home; the confined runs are in test_proposer.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolver.evaluation.program_folders import command_problem, first_word, program_folders


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def link(path: Path, target: Path | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    for key in (".ssh/id_ed25519", ".local/share/keyrings/login.keyring", ".claude/.credentials.json"):
        executable(home / key, "secret\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def test_an_npm_global_under_nvm_brings_its_node_and_packages(home):
    node = home / ".nvm/versions/node/v22.1.0"
    executable(node / "bin/node", "#!/bin/sh\n")
    executable(node / "lib/node_modules/@openai/codex/bin/codex.js", "#!/usr/bin/env node\n")
    link(node / "bin/codex", "../lib/node_modules/@openai/codex/bin/codex.js")
    found = program_folders("codex exec --full-auto 'Read TASK.md'", [node / "bin", Path("/usr/bin")], keep_out=())
    assert found.program == node / "bin/codex" and found.search == (node / "bin",)  # `env node` finds the same node
    assert {node / "bin", node / "lib"} <= set(found.readable) and found.kept_out == ()
    assert all(".nvm" in p.parts or home not in p.parents for p in found.readable)


def test_a_pipx_console_script_brings_its_virtual_environment_not_the_home_around_it(home):
    venv = home / ".local/share/pipx/venvs/aider-chat"
    link(venv / "bin/python", "/usr/bin/python3")
    executable(venv / "bin/aider", f"#!{venv}/bin/python\n")
    (venv / "lib/python3.11/site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    link(home / ".local/bin/aider", venv / "bin/aider")
    found = program_folders("aider --yes", [home / ".local/bin", Path("/usr/bin")], keep_out=())
    assert {home / ".local/bin", venv / "bin", venv / "lib", venv / "pyvenv.cfg", Path("/usr/lib")} <= set(found.readable)
    assert found.search == (home / ".local/bin",)
    assert home / ".local/share" not in found.readable and home / ".local" not in found.readable


def test_a_pyenv_shim_brings_pyenv(home):
    pyenv = home / ".pyenv"
    executable(pyenv / "libexec/pyenv", "#!/usr/bin/env bash\n")
    executable(pyenv / "shims/python3", f'#!/usr/bin/env bash\nexec "{pyenv}/libexec/pyenv" exec python3 "$@"\n')
    found = program_folders("python3 coder.py", [pyenv / "shims", Path("/usr/bin")], keep_out=())
    assert {pyenv / "shims", pyenv} <= set(found.readable)


def test_claude_codes_native_binary_and_its_local_install(home):
    binary = executable(home / ".local/share/claude/versions/2.1.197", "\x7fELF")
    link(home / ".local/bin/claude", binary)
    found = program_folders("claude -p 'Read TASK.md'", [home / ".local/bin"], keep_out=())
    assert set(found.readable) == {home / ".local/bin", home / ".local/share/claude/versions"}
    local = home / ".claude/local"
    executable(local / "claude", f'#!/bin/bash\nexec "{local}/node_modules/.bin/claude" "$@"\n')
    found = program_folders("claude", [local], keep_out=())
    assert local in found.readable and home / ".claude" not in found.readable  # the credentials beside it stay out


def test_what_is_never_granted(home, tmp_path):
    executable(home / ".ssh/bin/agent", "\x7fELF")
    executable(home / "agent", "\x7fELF")
    found = program_folders("agent", [home / ".ssh/bin"], keep_out=())
    assert found.readable == () and [str(f) for f, _ in found.kept_out] == [str(home / ".ssh/bin")]
    assert "where keys or private settings live" in found.kept_out[0][1]
    found = program_folders("agent", [home], keep_out=())
    assert found.readable == () and found.kept_out == ((home, f"it is your home folder {home}, where keys live"),)
    assert command_problem("true", (str(tmp_path),), tmp_path / "repo") == (
        f"--proposer-read {tmp_path}: it holds your home folder {home}, where keys live; name the folder its program is installed in instead"
    )
    work = tmp_path / "work"
    executable(work / "coder", "\x7fELF")
    assert command_problem(f"{work}/coder", (), work / "repo") == (
        f"--proposer-command: {work}/coder runs from {work}, which the command may not read (it holds {work / 'repo'}); install it elsewhere"
    )


def test_the_program_of_a_command_line():
    assert first_word("OPENAI_BASE_URL=http://127.0.0.1:1 codex exec 'x y'") == "codex"
    assert first_word("/opt/bin/coder --fast # comment") == "/opt/bin/coder"
    for line in ("exec codex", "cd agent && aider", "$CODER run", "~/bin/coder", "'unclosed", "", "(coder)"):
        assert first_word(line) is None, line


def test_what_stops_a_command_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert command_problem("./coder.sh", (), tmp_path) == (
        "--proposer-command: ./coder.sh is a relative path, and the command runs in its own workspace; give its full path"
    )
    problem = command_problem("no-such-coder --fix", (), tmp_path)
    assert problem.startswith("--proposer-command: no-such-coder is not installed: not in your PATH, in ") and "install it" in problem
    assert command_problem("sh -c true", (), tmp_path) is None and command_problem("exec whatever", (), tmp_path) is None
    executable(tmp_path / "tools/bin/coder", "\x7fELF")
    assert command_problem("coder", (str(tmp_path / "tools"),), tmp_path / "repo") is None  # found in a --proposer-read folder
