"""Terminal rendering of evaluation results (rich)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evolver import events as ev
from evolver.data import EvalResult


def eval_table(result: EvalResult) -> Table:
    s = result.summary
    table = Table(title=f"evolver eval {result.run_id}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    where = f"{result.domain}" + (f"/{result.split}" if result.split else "")
    table.add_row("tasks x trials", f"{s.num_tasks} x {s.num_trials} on {where}")
    table.add_row("agent / user model", f"{result.models['agent'].model} / {result.models['user'].model}")
    table.add_row("average reward", "n/a" if s.avg_reward is None else f"{s.avg_reward:.3f}  ({s.scored} scored)")
    for k, v in s.pass_hat_k.items():
        table.add_row(f"pass^{k}", f"{v:.3f}")
    table.add_row("failed by the agent", str(s.failed))
    table.add_row("infrastructure errors", f"[red]{s.infra_errors}[/red]" if s.infra_errors else "0")
    for role, u in sorted(s.usage.items()):
        table.add_row(f"{role} tokens (in/out)", f"{u.prompt_tokens:,} / {u.completion_tokens:,}   ${u.cost:.4f}")
    table.add_row("duration", f"{s.duration:.1f} s")
    if result.harness:
        table.add_row("harness layers", ", ".join(f"{k}={v}" for k, v in result.harness.items()))
    return table


_bars: dict[int, list] = {}  # console -> [its one live Progress, evaluations drawing on it]
_bars_lock = threading.Lock()


@contextmanager
def progress_bar(console: Console, label: str):
    """Yields a callback (done, total) that drives a progress bar on the console.

    Evaluations running at once (the candidates of an iteration) share one live
    display, a bar each. Off when the console is not a terminal: piped output stays clean.
    """
    if not console.is_terminal:
        yield lambda done, total: None
        return
    with _bars_lock:
        entry = _bars.get(id(console))
        if entry is None:
            progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=console, transient=True)
            progress.start()
            entry = _bars[id(console)] = [progress, 0]
        entry[1] += 1
        progress = entry[0]
        task = progress.add_task(label, total=None)
    try:
        yield lambda done, total: progress.update(task, completed=done, total=total or None)
    finally:
        with _bars_lock:
            progress.remove_task(task)
            entry[1] -= 1
            if entry[1] == 0:
                progress.stop()
                del _bars[id(console)]


class ConsoleView:
    """The terminal's view of a run: renders the loop's events (evolver.events), from any thread."""

    def __init__(self, console: Console):
        self.console = console
        self.bars: dict[str, tuple] = {}  # evaluation -> (its progress_bar context, update)
        self.lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        with self.lock:
            if isinstance(event, ev.EvalProgress):
                if event.name not in self.bars:
                    bar = progress_bar(self.console, event.name)
                    self.bars[event.name] = (bar, bar.__enter__())
                self.bars[event.name][1](event.done, event.total)
            elif isinstance(event, ev.EvalFinished):
                bar = self.bars.pop(event.name, None)
                if bar:
                    bar[0].__exit__(None, None, None)
            else:
                for line in _lines(event, self.console.is_terminal):
                    self.console.print(line)


def _lines(event: ev.Event, terminal: bool) -> list[str]:
    if isinstance(event, ev.Phase):  # a log file hears of every phase; a terminal sees the bars
        return [] if terminal else [f"{time.strftime('%H:%M:%S')} {event.text}"]
    if isinstance(event, ev.Baseline):
        return [f"baseline: analysis reward {_fmt(event.analysis)}, gate reward {_fmt(event.gate)}"]
    if isinstance(event, ev.NoiseFloor):
        where = f"with {event.tasks} gate tasks and {event.trials} trial(s) per task"
        if event.points is None:
            return [f"[yellow]warning:[/yellow] {where} no effect reaches 80% power: only a candidate that fixes nearly every gate task can be kept; add gate tasks or trials"]
        lines = [f"noise floor: {where} the gate resolves effects of about {event.points:.1f} points (80% power)"]
        if 0 < event.min_effect_points < event.points:  # 0 means no minimum was asked for
            lines.append(f"[yellow]warning:[/yellow] the minimum effect ({event.min_effect_points:.1f} points) is below the noise floor; smaller gains will usually be rejected")
        return lines
    if isinstance(event, ev.Estimate):
        return [f"estimate from the baseline: ${event.usd_per_simulation:.4f} per simulation; the remaining run takes at most "
                f"{event.simulations:,} simulations, about ${event.usd:.2f} and {event.hours:.1f} h"]
    if isinstance(event, ev.Decided):
        colour = {"accepted": "green", "rejected": "red"}.get(event.status, "yellow")
        return [f"iteration {event.label}: [{colour}]{event.status}[/{colour}] {event.title or ''} - {event.reason}"]
    if isinstance(event, ev.Holdout):
        return [f"holdout: base {_fmt(event.base)}, best {_fmt(event.best)} (never used for any decision)"]
    if isinstance(event, ev.Ended):
        return {
            "stopped": [f"[bold]stopped:[/bold] {event.reason}"],
            "paused": [f"[yellow]paused[/yellow]: the meta-LLM failed after retries ({event.reason}); "
                       f"resume with `evolver run --resume {event.run_id}` once it is back"],
            "interrupted": [f"[yellow]interrupted[/yellow]: resume with `evolver run --resume {event.run_id}`"],
        }[event.how]
    return []


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _score(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def history_table(run_id: str, rows: list[dict]) -> Table:
    table = Table(title=f"evolver history {run_id}", title_justify="left")
    for col in ("cand", "branch", "parent", "title", "analysis", "gate (inc -> cand)", "delta", "verdict", "reason", "cost"):
        table.add_column(col, overflow="fold")
    for r in rows:
        colour = {"accepted": "green", "rejected": "red"}.get(r["verdict"], "yellow")
        delta = "-" if r["gate_delta"] is None else f"{r['gate_delta']:+.3f}"
        table.add_row(
            f"{r['candidate']}{' *' if r['is_best'] else ''}", r["branch"] or "-", str(r["parent"]), r["title"] or "-",
            _score(r["analysis"]), f"{_score(r['gate_incumbent'])} -> {_score(r['gate_candidate'])}", delta,
            f"[{colour}]{r['verdict']}[/{colour}]", r["reason"], "" if r["cost"] is None else f"${r['cost']:.4f}",
        )
    return table


def show_candidate(console: Console, info: dict) -> None:
    """One candidate, or each candidate of an iteration that had several."""
    if "candidates" in info:
        console.print(f"[bold]iteration {info['iteration']}[/bold]: {len(info['candidates'])} candidates, "
                      f"kept {info['kept'] or 'none'}  [{info['status']}]\n")
        for cand in info["candidates"]:
            show_candidate(console, cand)
            console.print()
        return
    console.print(f"[bold]candidate {info['label']}[/bold]: {info['title'] or '(no patch)'}  [{info['status']}]")
    console.print(f"branch {info['branch'] or '-'}  commit {info['commit'] or '-'}  parent {'base' if info['parent'] == 0 else info['parent']}")
    console.print(f"verdict: {info['reason']}")
    if info["rationale"]:
        console.print("\n[bold]rationale[/bold]\n" + info["rationale"])
    if info["diff"]:
        console.print("\n[bold]diff[/bold]")
        console.print(info["diff"], markup=False, highlight=False)
    if info["flips"]:
        console.print("\n[bold]gate tasks whose pass rate changed[/bold]")
        for f in info["flips"]:
            console.print(f"  {f['task']}: {f['incumbent']:.2f} -> {f['candidate']:.2f}")