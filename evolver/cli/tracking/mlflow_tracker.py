"""MLflow as a subscriber on a run's events: settings, per-iteration metrics and verdicts, the report.

One MLflow run per evolver run, in the experiment "evolver", tagged with the evolver run id so
that a resumed run logs into the same one. Metrics take the iteration as their step (0: the
base). Each event only says when to look: what is logged is read from the run store, so a
resumed run logs what is missing and nothing twice. Where to: MLFLOW_TRACKING_URI, else
mlruns/ in the repository (MLflow's file store, ignored by git like runs/).

A tracker failure (a server gone, a full disk) is reported once and ends the tracking, never
the run: the run directory keeps every result, and `evolver report` reads it any time.
"""

from __future__ import annotations

import os
import string
import threading
import time

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from rich.console import Console

from evolver import events as ev
from evolver.cli.runreport import write_report
from evolver.cli.runreport.facts import cost_of
from evolver.store.lineage import exclude_runs_dir
from evolver.store.rundir import RunDir
from evolver.store.runstate import IterationRecord

EXPERIMENT = "evolver"
RUN_TAG = "evolver.run_id"
BATCH = 100  # MLflow takes at most 1000 metrics or 100 params per batch
# Steps already logged are read back on resume from these metrics: one per kind of sync.
MARKERS = ("gate_incumbent", "kept", "analysis_incumbent", "holdout/best")


def tracking_uri(run: RunDir) -> str:
    """MLFLOW_TRACKING_URI, else the repository's mlruns/ (MLflow's file store, which MLflow
    keeps working only when asked: MLFLOW_ALLOW_FILE_STORE)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    exclude_runs_dir(run.repo, "mlruns")
    return (run.repo / "mlruns").as_uri()


class MlflowTracker:
    def __init__(self, run: RunDir, console: Console):
        self.run = run
        self.console = console
        self.lock = threading.Lock()  # events arrive from the loop's thread and the candidates'
        self.client = MlflowClient(tracking_uri(run))
        self.broken = False
        self.holdout_seen = False
        self.mlflow_run_id, self.logged = self._open()

    # -- events ----------------------------------------------------------------
    def __call__(self, event: ev.Event) -> None:
        if self.broken or not isinstance(event, (ev.Baseline, ev.Decided, ev.Holdout, ev.Ended)):
            return
        with self.lock:
            try:
                self._on(event)
            except Exception as exc:  # the tracker's fault must never stop a run that costs money
                self.broken = True
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                self.console.print(
                    f"[yellow]warning:[/yellow] MLflow tracking stopped ({type(exc).__name__}: {first}); "
                    f"the run goes on and {self.run.path} keeps every result"
                )

    def _on(self, event: ev.Event) -> None:
        if isinstance(event, ev.Baseline):
            self._log(metrics=self._step(0, {"gate_incumbent": event.gate, "analysis_incumbent": event.analysis}))
        elif isinstance(event, ev.Decided):
            self.sync()
        elif isinstance(event, ev.Holdout):
            self.holdout_seen = True
            self.sync()
            self.finish("stopped")
        elif isinstance(event, ev.Ended):
            self.sync()
            self._log(tags=[RunTag("evolver.status", event.how), RunTag("evolver.stop_reason", event.reason[:5000])])
            # A run that stopped measures its holdout next, when it has one: the Holdout event finishes it then.
            if not (event.how == "stopped" and self.run.manifest().holdout_tasks and not self.holdout_seen):
                self.finish(event.how)

    # -- what is logged ------------------------------------------------------
    def sync(self) -> None:
        """Log every finished iteration, analysis score and holdout result not logged yet."""
        state = self.run.state()
        metrics: list[Metric] = []
        tags: list[RunTag] = []
        for record in self.run.iterations():
            n = record.iteration
            if n < state.next_iteration and ("kept", n) not in self.logged:
                metrics += self._iteration_metrics(record)
                tags += [RunTag(f"verdict.{c.label}", f"{c.status}: {c.reason}"[:5000]) for c in record.candidates]
            if record.analysis is not None and ("analysis_incumbent", n) not in self.logged:
                metrics += self._step(n, {"analysis_incumbent": record.analysis})
        scores = self.run.holdout()
        if scores is not None:
            step = state.next_iteration - 1
            if ("holdout/best", step) not in self.logged:
                metrics += self._step(step, {"holdout/base": scores.get("base"), "holdout/best": scores.get("best")})
        self._log(metrics=metrics, tags=tags)

    def _iteration_metrics(self, record: IterationRecord) -> list[Metric]:
        n = record.iteration
        values = {"gate_incumbent": record.gate_incumbent, "kept": 1.0 if record.kept else 0.0}
        for cand in record.candidates:
            letter = cand.label.lstrip(string.digits)  # "3b" -> "b"; "" when the iteration has one candidate
            prefix = f"candidate_{letter}" if letter else "candidate"
            last = cand.verdicts[-1] if cand.verdicts else {}
            values.update(
                {
                    f"{prefix}/gate": cand.gate_candidate,
                    f"{prefix}/effect": last.get("effect"),
                    f"{prefix}/ci_low": last.get("ci_low"),
                    f"{prefix}/p_value": last.get("p_value"),
                    f"{prefix}/accepted": 1.0 if cand.status == "accepted" else 0.0,
                }
            )
        for role, usage in record.usage.items():
            cost = cost_of(usage)
            values[f"tokens/{role}"] = cost.tokens
            if cost.usd is not None:  # an unknown price is no metric at all, never $0
                values[f"cost_usd/{role}"] = cost.usd
        return self._step(n, values)

    def finish(self, how: str) -> None:
        """Attach the report, log the run's totals and close the MLflow run (FINISHED, or KILLED when
        it was interrupted or paused: resuming reopens it)."""
        state = self.run.state()
        totals = {f"total_tokens/{role}": cost_of(u).tokens for role, u in state.usage.items()}
        totals.update({f"total_cost_usd/{role}": cost_of(u).usd for role, u in state.usage.items() if cost_of(u).usd is not None})
        totals.update(
            {
                "decisions": state.decisions,
                "expected_false_keeps": state.decisions * self.run.manifest().gate["alpha"],
                "best_iteration": state.incumbent,
            }
        )
        self._log(metrics=self._step(state.next_iteration - 1, totals), tags=[RunTag("evolver.best_commit", state.incumbent_commit)])
        if how == "stopped":
            self.client.log_artifact(self.mlflow_run_id, str(write_report(self.run)))
        self.client.set_terminated(self.mlflow_run_id, status="FINISHED" if how == "stopped" else "KILLED")

    # -- MLflow ----------------------------------------------------------------
    def _open(self) -> tuple[str, set]:
        """The MLflow run of this evolver run: found again on resume (with the steps it already has), else created."""
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{self.run.run_id}'", max_results=1)
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            logged = {(key, m.step) for key in MARKERS for m in self.client.get_metric_history(run_id, key)}
            return run_id, logged
        manifest = self.run.manifest()
        run = self.client.create_run(
            experiment_id,
            run_name=self.run.run_id,
            tags={
                RUN_TAG: self.run.run_id,
                "evolver.repo": manifest.repo,
                "evolver.best_branch": f"evolver/{self.run.run_id}/best",
                "evolver.base_commit": manifest.base_commit,
            },
        )
        params = {
            **{f"config.{k}": v for k, v in manifest.config.items()},
            **{f"model.{role}": m.model for role, m in manifest.models.items()},
            **{f"gate.{k}": v for k, v in manifest.gate.items()},
            **{f"version.{k}": v for k, v in manifest.versions.items()},
            "tasks.analysis": len(manifest.analysis_tasks),
            "tasks.gate": len(manifest.gate_tasks),
            "tasks.holdout": len(manifest.holdout_tasks),
            "split_note": manifest.split_note,
        }
        items = [Param(k, _param(v)) for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(run.info.run_id, params=items[i : i + BATCH])
        return run.info.run_id, set()

    def _step(self, step: int, values: dict) -> list[Metric]:
        now = int(time.time() * 1000)
        return [
            Metric(key, float(value), now, step) for key, value in values.items() if value is not None and (key, step) not in self.logged
        ]

    def _log(self, metrics: list[Metric] = (), tags: list[RunTag] = ()) -> None:
        metrics, tags = list(metrics), list(tags)
        for i in range(0, max(len(metrics), len(tags)), BATCH):
            self.client.log_batch(self.mlflow_run_id, metrics=metrics[i : i + BATCH], tags=tags[i : i + BATCH])
        self.logged.update((m.key, m.step) for m in metrics)


def _param(value) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text[:6000]  # MLflow's limit for a parameter's value
