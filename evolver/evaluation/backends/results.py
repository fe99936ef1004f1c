"""What every backend makes of an evaluation's folder when it ends: one record per task x trial (a missing
one stands in as an infrastructure error of the worker, or as the candidate's failure when it did not
import), and the EvalResult that says which models, harness layers and isolation measured them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Optional

from evolver.data import EvalRequest, EvalResult, SimRecord
from evolver.evaluation.metrics import summarize
from evolver.store.evaldir import EvalDir


def eval_result(
    req: EvalRequest,
    run_id: str,
    evaluation: EvalDir,
    task_ids: list[str],
    *,
    isolation: dict,
    candidate_error: Optional[str],
    note: Optional[str],
    duration: float,
) -> EvalResult:
    """The result of ``req`` from what its folder holds now."""
    records = complete(evaluation.records(), task_ids, req.trials, candidate_error, note)
    return EvalResult(
        run_id=run_id,
        checkout=req.checkout,
        domain=req.domain,
        split=req.split,
        task_ids=task_ids,
        trials=req.trials,
        seed=req.seed,
        max_steps=req.max_steps,
        models={"agent": req.agent, "user": req.user, "judge": req.judge},
        harness=harness_switches(Path(req.checkout)),
        isolation=isolation,
        candidate_error=candidate_error,
        worker_note=note,
        summary=summarize(records, len(task_ids), req.trials, duration),
        simulations=records,
    )


def complete(
    records: list[SimRecord], task_ids: list[str], trials: int, candidate_error: Optional[str], note: Optional[str]
) -> list[SimRecord]:
    """One record per task x trial: the worker's, or a stand-in saying why it is missing."""
    have = {(r.task_id, r.trial): r for r in records}
    full = []
    for trial in range(trials):
        for task in task_ids:
            rec = have.get((task, trial))
            if rec is None and candidate_error:
                rec = SimRecord(
                    task_id=task, trial=trial, outcome="failed", reward=0.0, termination_reason="agent_error", error=candidate_error
                )
            elif rec is None:
                rec = SimRecord(
                    task_id=task,
                    trial=trial,
                    outcome="infra_error",
                    termination_reason="infra_error",
                    error_role="worker",
                    error=note or "not run",
                )
            full.append(rec)
    return full


SWITCHES = "agent/harness.toml"  # which harness layers are on; no file: all off


def read_switches(root: Path) -> dict | None:
    """A checkout's layer switches ({} without the file: all off); None when the file cannot be read as TOML."""
    path = Path(root) / SWITCHES
    try:
        return tomllib.loads(path.read_text()) if path.exists() else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


def harness_switches(checkout: Path) -> dict:
    """Which harness layers were on, so every score says so."""
    switches = read_switches(checkout)
    return {"error": f"{SWITCHES} is not valid TOML"} if switches is None else switches
