"""The run report: one self-contained HTML file per run, and a short markdown summary.

facts.collect(run)  -> RunFacts      plain data read from the run store (history, show, git)
charts.*(facts)     -> plotly figures
page.render(facts)  -> HTML          plotly.js embedded: opens from disk, no server, no network
markdown.summary(facts) -> str       for a pull-request description
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from evolver.cli.runreport.facts import RunFacts, collect
from evolver.data import write_text_atomic
from evolver.store.rundir import RunDir


def write_report(run: RunDir, facts: Optional[RunFacts] = None) -> Path:
    """Write runs/<run>/report.html (from ``facts`` when the caller has them) and return its path."""
    from evolver.cli.runreport.page import render

    path = run.report_file
    write_text_atomic(path, render(facts or collect(run)))
    return path
