"""`evolver show RUN ITER --turns TASK`: one simulation of a run, turn by turn, as the model saw it.

Which simulation: the task's, in the evaluation ITER is about. An analysis task: the analysis the
proposer of ITER read (its incumbent's, `base` or 0: the baseline's); a gate task: the candidate's
gate evaluation (the reference for `base`); a holdout task: the holdout of the candidate's commit.
For a person, so values are shown as they were (a proposer only ever reads analysis simulations,
masked). The run report links each failed analysis simulation here (failed_analysis).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from evolver.data import SimRecord
from evolver.errors import UsageError
from evolver.evolution.harness_changes import Change, changes
from evolver.evolution.harness_code import HarnessCode
from evolver.evolution.turntext import Plain, summary, turn_lines
from evolver.store.evaldir import EvalDir
from evolver.store.lineage import Lineage
from evolver.store.rundir import RunDir
from evolver.store.runstate import slug
from evolver.store.turnview import TurnView


@dataclass
class Simulation:
    evaluation: str  # its name in the run, e.g. analysis-g0
    record: SimRecord
    view: TurnView
    changes: list[Change]
    code: Optional[HarnessCode]  # the agent that ran it, for the lines a change points to


def find_simulation(run: RunDir, which: str, task: str, trial: int) -> Simulation:
    """The simulation of ``task`` and ``trial`` in the evaluation ITER names; one line (UsageError) when there is none."""
    manifest = run.manifest()
    base = which in ("base", "0")
    record = None if base else _iteration(run, which)
    candidate = None if base else next((c for c in record.candidates if c.label == which), None)
    if task in manifest.analysis_tasks:
        # What the iteration's proposers read: its incumbent's analysis, or (population) its parent on a minibatch.
        name = "analysis-g0" if base else record.evidence or f"analysis-g{record.generation}"
        commit = manifest.base_commit if base else record.parent_commit
    elif task in manifest.gate_tasks or task in manifest.holdout_tasks:
        if not base and candidate is None:
            labels = ", ".join(c.label for c in record.candidates)
            raise UsageError(f"iteration {record.iteration} has several candidates ({labels}): name one of them for a gate or holdout task")
        commit = manifest.base_commit if base else candidate.commit
        if task in manifest.gate_tasks:
            name = "reference-g0" if base else f"iter-{slug(candidate.label)}-gate"
            if not base and any(r.task_id == task for r in run.evaluation(f"{name}2").records()):
                name += "2"  # a population child's second part of the gate
        else:
            name = f"holdout-{(commit or '')[:12]}"
    else:
        shown = ", ".join(manifest.analysis_tasks[:8]) + (", ..." if len(manifest.analysis_tasks) > 8 else "")
        raise UsageError(
            f"task '{task}' is not one of run {run.run_id}'s analysis, gate or holdout tasks (a task id, not a label such "
            f"as T4); its analysis tasks: {shown}"
        )
    evaluation = run.evaluation(name)
    found = {r.trial: r for r in evaluation.records() if r.task_id == task}
    if trial not in found:
        measured = ", ".join(map(str, sorted(found))) or "none"
        raise UsageError(f"{name} has no trial {trial} of task '{task}' (trials measured: {measured})")
    view = evaluation.read_turns(found[trial])
    if view is None:
        raise UsageError(
            f"{name} recorded no turns for task '{task}' trial {trial} (recorded since evolver records the model's view, "
            "when the simulation's agent started)"
        )
    switches = (evaluation.latest_result() or SimpleNamespace(harness={})).harness
    code = HarnessCode.parse(Lineage(run.repo, run.run_id).file_at(commit, "agent/agent.py"), switches) if commit else None
    return Simulation(name, found[trial], view, changes(view, switches), code)


def _iteration(run: RunDir, which: str):
    label = which.rstrip("abcdefghijklmnopqrstuvwxyz")
    record = run.iteration(int(label)) if label.isdigit() else None
    if record is None:
        known = [str(r.iteration) for r in run.iterations()]
        raise UsageError(f"run {run.run_id} has no iteration '{which}'; it has base, {', '.join(known) or 'no iteration yet'}")
    if which != label and not any(c.label == which for c in record.candidates):
        raise UsageError(f"iteration {record.iteration} has no candidate {which}; it has {', '.join(c.label for c in record.candidates)}")
    return record


def show_turns(run: RunDir, which: str, task: str, trial: int, as_json: bool, console: Console) -> int:
    sim = find_simulation(run, which, task, trial)
    if as_json:
        print(json.dumps(turns_info(sim), indent=2, default=str))
    else:
        print_turns(console, sim)
    return 0


def turns_info(sim: Simulation) -> dict:
    """For --json: the record, the whole view and the changes."""
    return {
        "evaluation": sim.evaluation,
        "record": sim.record.model_dump(),
        "view": sim.view.model_dump(mode="json"),
        "changes": [
            {**c.__dict__, "step": c.step, "where": [p.text() for p in sim.code.places(c)] if sim.code else []} for c in sim.changes
        ],
    }


def print_turns(console: Console, sim: Simulation) -> None:
    r = sim.record
    reward = "not measured" if r.reward is None else f"{r.reward:.2f}"
    console.print(
        f"[bold]{r.task_id}[/bold] trial {r.trial} in {sim.evaluation}: reward {reward}, ended by {r.termination_reason} "
        f"after {r.steps} messages, {len(sim.view.turns)} agent turn(s)"
    )
    line = summary(sim.changes, sim.code, kinds=len(sim.changes))
    console.print(Text("the harness changed: " + (line or "nothing"), style="bold yellow" if line else ""))
    if sim.view.cut:
        console.print(Text(f"recording stopped early: {sim.view.cut}", style="red"))
    for n in range(1, len(sim.view.turns) + 1):
        text = Text()
        for i, line in enumerate(turn_lines(sim.view, n, sim.changes, Plain(), sim.code, width=400)[1:]):
            style = "yellow" if line.startswith((" - ", "   also")) else "bold" if line[:2] in ("1.", "2.", "3.") else ""
            text.append(("\n" if i else "") + line, style=style)
        console.print(Panel(text, title=f"turn {n} of {len(sim.view.turns)}", title_align="left"))


def failed_analysis(run: RunDir) -> list[dict]:
    """Every failed simulation of the run's analysis evaluations (what its proposers read), each with what the harness
    changed in it and the command that shows it turn by turn."""
    manifest, rows = run.manifest(), []
    first = {}  # what a proposer read -> the first iteration whose proposers read it, and the agent it measured
    for record in run.iterations():
        first.setdefault(record.evidence or f"analysis-g{record.generation}", (str(record.iteration), record.parent_commit))
    first.setdefault("analysis-g0", ("base", manifest.base_commit))
    lineage = Lineage(run.repo, run.run_id)
    for name, (which, commit) in sorted(first.items()):
        generation = int(name[len("analysis-g") :]) if name.startswith("analysis-g") else int(which)
        evaluation = run.evaluation(name)
        result = evaluation.latest_result()
        if result is None:
            continue
        code = HarnessCode.parse(lineage.file_at(commit, "agent/agent.py"), result.harness)
        for r in sorted(result.simulations, key=lambda r: (r.task_id, r.trial)):
            if r.outcome == "infra_error" or (r.reward or 0.0) >= 1.0:
                continue
            rows.append(
                {
                    "generation": generation,
                    "iteration": which,
                    "task": r.task_id,
                    "trial": r.trial,
                    "reward": r.reward,
                    "ended": r.termination_reason,
                    "harness": _harness(evaluation, r, result.harness, code),
                    "command": f"evolver show {run.run_id} {which} --turns {r.task_id}" + (f" --trial {r.trial}" if r.trial else ""),
                }
            )
    return rows


def _harness(evaluation: EvalDir, record: SimRecord, switches: dict, code: Optional[HarnessCode]) -> Optional[str]:
    view = evaluation.read_turns(record)
    return None if view is None else summary(changes(view, switches), code) or "nothing"
