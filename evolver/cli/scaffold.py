"""`evolver init`: set up a repository whose agent evolver will evolve."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from evolver.cli.settings_text import toml_template
from evolver.errors import UsageError
from evolver.store.rundir import runs_dir


def _template_files(migration=None) -> dict[str, str]:
    """The baseline agent, its layer switches and skills: once pristine under
    agent/templates/, once as the working copy under agent/ that evolution edits.
    With a migration (evolver.cli.migrate): its agent instead, or the template
    with its switches, and its settings and learnings."""
    base = resources.files("evolver.baseline")
    agent = (base / "tau_bench.py").read_text()
    harness = (base / "harness.toml").read_text()
    skills = {
        f"skills/{p.name}": p.read_text() for p in sorted(base.joinpath("skills").iterdir(), key=lambda p: p.name) if p.name.endswith(".md")
    }
    files = {
        "agent/templates/tau_bench.py": agent,
        "agent/templates/__init__.py": (base / "__init__.py").read_text(),
        "agent/templates/harness.toml": harness,
        "agent/agent.py": agent,
        "agent/harness.toml": harness,
        "evolver.toml": toml_template(),
    }
    for rel, text in skills.items():
        files[f"agent/templates/{rel}"] = text
        files[f"agent/{rel}"] = text
    if migration is not None:
        _migrate(files, migration)
    return files


def _migrate(files: dict[str, str], m) -> None:
    from evolver.cli.migrate import LEARNINGS_FILE

    if m.agent is not None:  # another tool's agent, as it is: evolver's layers, switches and skills are not its
        for rel in [r for r in files if r.startswith("agent/")]:
            del files[rel]
        files.update({"agent/agent.py": m.agent, "agent/templates/tau_bench.py": m.baseline or m.agent})
    if m.switches is not None:
        text = files["agent/harness.toml"]
        for layer, on in m.switches.items():
            text = re.sub(rf"^{layer}(\s*)=(\s*)(true|false)", rf"{layer}\g<1>=\g<2>{'true' if on else 'false'}", text, flags=re.M)
        files["agent/harness.toml"] = text
    if m.h5_top_k is not None:
        files["agent/agent.py"] = re.sub(r"^H5_TOP_K = \d+", f"H5_TOP_K = {m.h5_top_k}", files["agent/agent.py"], count=1, flags=re.M)
    if m.learnings is not None:
        files[LEARNINGS_FILE] = m.learnings
    files["evolver.toml"] = toml_template(m.settings)


def init_repo(target: Path, force: bool = False, migration=None) -> list[str]:
    """Write the agent template (or a migration's agent, evolver.cli.migrate), a config file and
    ignore runs/. Returns the paths written."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is a file, not a directory; pass a directory to `evolver init`")
    files = _template_files(migration)
    existing = [p for p in files if (target / p).exists()]
    if existing and not force:
        raise UsageError(f"{', '.join(existing)} already exist in {target}; pass --force to overwrite them")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    runs_dir(target).mkdir(exist_ok=True)
    gitignore = target / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    if "runs/" not in lines:
        gitignore.write_text("\n".join(lines + ["runs/"]) + "\n")
    return sorted(files) + [".gitignore"]
