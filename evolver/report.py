"""Terminal rendering of evaluation results (rich)."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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


@contextmanager
def progress_bar(console: Console, label: str):
    """Yields a callback (done, total) that drives a progress bar on the console.

    Off when the console is not a terminal: piped output stays clean.
    """
    if not console.is_terminal:
        yield lambda done, total: None
        return
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    ) as progress:
        task = progress.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total or None)

        yield update


def _score(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def history_table(run_id: str, rows: list[dict]) -> Table:
    table = Table(title=f"evolver history {run_id}", title_justify="left")
    for col in ("iter", "branch", "parent", "title", "analysis", "gate (inc -> cand)", "delta", "verdict", "reason", "cost"):
        table.add_column(col, overflow="fold")
    for r in rows:
        colour = {"accepted": "green", "rejected": "red"}.get(r["verdict"], "yellow")
        delta = "-" if r["gate_delta"] is None else f"{r['gate_delta']:+.3f}"
        table.add_row(
            f"{r['iteration']}{' *' if r['is_best'] else ''}", r["branch"] or "-", str(r["parent"]), r["title"] or "-",
            _score(r["analysis"]), f"{_score(r['gate_incumbent'])} -> {_score(r['gate_candidate'])}", delta,
            f"[{colour}]{r['verdict']}[/{colour}]", r["reason"], f"${r['cost']:.4f}",
        )
    return table


def show_candidate(console: Console, info: dict) -> None:
    console.print(f"[bold]iteration {info['iteration']}[/bold]: {info['title'] or '(no patch)'}  [{info['status']}]")
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
