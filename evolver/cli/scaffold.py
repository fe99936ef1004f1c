"""`evolver init`: set up a repository whose agent evolver will evolve."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from evolver.cli.settings_text import toml_template
from evolver.errors import UsageError

def _template_files() -> dict[str, str]:
    """The baseline agent, its layer switches and skills: once pristine under
    agent/templates/, once as the working copy under agent/ that evolution edits."""
    base = resources.files("evolver.baseline")
    agent = (base / "tau_bench.py").read_text()
    harness = (base / "harness.toml").read_text()
    skills = {f"skills/{p.name}": p.read_text() for p in sorted(base.joinpath("skills").iterdir(), key=lambda p: p.name) if p.name.endswith(".md")}
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
    return files


def init_repo(target: Path, force: bool = False) -> list[str]:
    """Write the agent template, a config file and ignore runs/. Returns the paths written."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is a file, not a directory; pass a directory to `evolver init`")
    files = _template_files()
    existing = [p for p in files if (target / p).exists()]
    if existing and not force:
        raise UsageError(f"{', '.join(existing)} already exist in {target}; pass --force to overwrite them")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (target / "runs").mkdir(exist_ok=True)
    gitignore = target / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    if "runs/" not in lines:
        gitignore.write_text("\n".join(lines + ["runs/"]) + "\n")
    return sorted(files) + [".gitignore"]
