"""`evolver init`: set up a repository whose agent evolver will evolve."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from evolver.errors import UsageError

CONFIG_TEMPLATE = """\
# evolver configuration. Environment variables (EVOLVER_<KEY>) override these
# values, and command-line flags override both.

# One litellm model string per role, or "local" for the embedded model. Unset:
# OpenAI's gpt-4.1-mini / gpt-4.1 when OPENAI_API_KEY is set, else "local".
# The user simulator changes scores, so it is written into every result file.
# For any OpenAI-compatible server (vLLM, Ollama, llama.cpp) use
# "openai/<name>" and set api_base.
# agent_model = "gpt-4.1-mini"
# user_model = "gpt-4.1-mini"
# meta_model = "gpt-4.1"
# local_size = "default"  # the embedded model: default (1.5B) or small (0.5B)
# judge_model = ""        # tau2's NL-assertion judge; empty means the user model
# api_base = "http://127.0.0.1:8000/v1"
# agent_api_base = ""     # per-role servers win over api_base
# user_api_base = ""
# meta_api_base = ""

domain = "mock"            # airline, retail, telecom or mock
# split = "train"          # tau2's train/test (mock has only base)
trials = 1
concurrency = 4
seed = 300
max_steps = 30
"""


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
        "evolver.toml": CONFIG_TEMPLATE,
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
