"""The figures the documentation quotes from a command are what the command prints today.

`evolver run --dry-run` is the estimator's voice: docs/models.md tabulates what it says an iteration costs
per domain and meta model, and README.md quotes it. Each is run here through the command line, as
the documents say to run it, and compared with the documents, so a change to the estimator (a new search
policy, a new price) fails here until the documents say the same.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, init_repo, run_cli

KEYS = {"OPENAI_API_KEY": "sk-test-not-a-real-key", "ANTHROPIC_API_KEY": "sk-ant-test-not-a-real-key", "GEMINI_API_KEY": "not-a-real-key"}
USERS = ["--agent-model", "openai/gpt-4.1-mini", "--user-model", "openai/gpt-4.1-mini"]  # docs/models.md's loop
ESTIMATE = re.compile(r"about ([\d,]+) simulations expected, at most ([\d,]+);")
META = re.compile(
    r"^  meta: about ([\d,]+) tokens \((\$[\d.]+)\), at most ([\d,]+) \((\$[\d.]+)\); with the prompt cache \(85% of the prompt "
    r"read from it\): about (\$[\d.]+), at most (\$[\d.]+)$",
    re.M,
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return init_repo(tmp_path_factory.mktemp("docs") / "target")


def dry_run(repo, *args: str, env: dict | None = None) -> str:
    proc = run_cli(["run", str(repo), "--dry-run", *args], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def number(text: str) -> int:
    return int(text.replace(",", ""))


def table(doc: str, header: str) -> dict[str, list[str]]:
    """The rows of the markdown table under ``header``, by their first cell."""
    lines = doc[doc.index(header) :].splitlines()[2:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))]
    ]
    return {row[0]: row[1:] for row in rows}


def test_what_an_iteration_costs_in_docs_models_is_what_the_dry_run_prints(repo):
    doc = (ROOT / "docs" / "models.md").read_text()
    per_domain = table(doc, "| domain | simulations per iteration, expected | at most |")
    printed = {}
    for domain in per_domain:
        one, two = (ESTIMATE.search(dry_run(repo, "--iterations", n, "--domain", domain, *USERS, env=KEYS)).groups() for n in ("1", "2"))
        printed[domain] = [f"{number(two[0]) - number(one[0]):,}", f"{number(two[1]) - number(one[1]):,}"]
    assert per_domain == printed, f"docs/models.md says {per_domain}; `run --dry-run` prints {printed} per iteration: update the table"
    per_meta = table(doc, "| meta model | meta tokens per iteration |")
    looped = re.search(r"for meta in (.+); do", doc).group(1).split()  # the models as the document's loop names them
    printed = {}
    for name in per_meta:
        model = next(m for m in looped if m.split("/", 1)[1] == name.split()[0])
        meta = META.search(dry_run(repo, "--iterations", "1", "--domain", "retail", *USERS, "--meta-model", model, env=KEYS))
        assert meta, f"no meta line priced with and without the prompt cache for {model}"
        tokens, usd, most, usd_most, cached, cached_most = meta.groups()
        printed[name] = [f"{tokens} ({most})", f"{usd} ({usd_most})", f"{cached} ({cached_most})"]
    assert per_meta == printed, f"docs/models.md says {per_meta}; `run --dry-run` prints {printed}: update the table"
    readme = (ROOT / "README.md").read_text()
    said = re.search(
        r"An iteration on retail is about ([\d,]+)\s+simulations plus \$([\d.]+)-([\d.]+) of meta tokens at list prices, "
        r"\$([\d.]+)-([\d.]+) with\s+the proposer's prompt cache",
        readme,
    )
    assert said, "README.md no longer says what an iteration on retail costs"
    dollars = [[float(cell.split()[0].lstrip("$")) for cell in row[1:]] for row in printed.values()]
    assert said.groups() == (
        per_domain["retail"][0],
        f"{min(d[0] for d in dollars):.2f}",
        f"{max(d[0] for d in dollars):.2f}",
        f"{min(d[1] for d in dollars):.2f}",
        f"{max(d[1] for d in dollars):.2f}",
    ), "README.md's figures are not docs/models.md's"
