"""Terminal rendering of evaluation results (rich)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from evolver import events as ev
from evolver.data import EvalResult, cost_text
from evolver.evolution.plan import CACHED_SHARE


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
    scored = [sim for sim in result.simulations if sim.outcome != "infra_error"]
    if scored:
        ended: dict[str, int] = {}
        for sim in scored:
            ended[sim.termination_reason or "?"] = ended.get(sim.termination_reason or "?", 0) + 1
        table.add_row("messages per simulation", f"{sum(sim.steps for sim in scored) / len(scored):.1f}")
        table.add_row("ended by", ", ".join(f"{reason} {n}" for reason, n in sorted(ended.items(), key=lambda kv: -kv[1])))
    for lane, tally in sorted(s.rate_limits.items()):
        table.add_row("rate limit", f"{lane}: {tally_text(tally.calls, tally.limited, tally.waited)}")
    table.add_row("failed by the agent", str(s.failed))
    table.add_row("infrastructure errors", f"[red]{s.infra_errors}[/red]" if s.infra_errors else "0")
    for role, tally in sorted(s.infra_by_role.items()):
        table.add_row("", infra_line(role, tally.count, tally.first))
    for role, u in sorted(s.usage.items()):
        table.add_row(f"{role} tokens (in/out)", f"{u.prompt_tokens:,} / {u.completion_tokens:,}   {cost_text([u])}")
    table.add_row("duration", f"{s.duration:.1f} s")
    if result.harness:
        table.add_row("harness layers", ", ".join(f"{k}={v}" for k, v in result.harness.items()))
    return table


_bars: dict[int, list] = {}  # console -> [its one live Progress, evaluations drawing on it]
_bars_lock = threading.Lock()


def _live(console: Console) -> Progress:
    """Bars with done/total, elapsed time and an ETA from the rate measured so far."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def infra_line(role: str, count: int, first: str) -> str:
    """ "user: 3 infra errors, first: ..." (rich markup in the message escaped)."""
    from rich.markup import escape

    return f"[red]{role}: {count} infra error{'' if count == 1 else 's'}[/red], first: {escape(first[:300])}"


def tally_text(calls: int, limited: int, waited: float) -> str:
    """What the calls to one provider endpoint and model met in its rate limit."""
    return f"{calls:,} calls, {limited:,} answered 429, {waited:,.1f} s waited for a turn"


def lane_text(lane: str, view: dict, live: bool = True) -> str:
    """One lane of the rate limiter (evolver.ratelimit's snapshot): the rate in use and where it comes from,
    calls waiting now (``live``), and what its calls met so far."""
    rate = "no limit known" if view.get("rpm") is None else f"{view['rpm']:g} rpm ({view.get('source') or '?'})"
    if view.get("tpm"):
        rate += f", {view['tpm']:,} tpm"
    now = f", {view.get('in_use_rpm', 0):g} calls in the last minute, {view.get('waiting', 0)} waiting" if live else ""
    return f"{lane}: {rate}{now}; {tally_text(view.get('calls', 0), view.get('limited', 0), view.get('waited', 0.0))}"


def _bar_label(name: str, mean: Optional[float]) -> str:
    return name if mean is None else f"{name}  mean reward {mean:.2f}"


@contextmanager
def progress_bar(console: Console, label: str):
    """Yields a callback (done, total, mean reward so far) that drives a progress bar on the console.

    Evaluations running at once (the candidates of an iteration) share one live
    display, a bar each. Off when the console is not a terminal: piped output stays clean.
    """
    if not console.is_terminal:
        yield lambda done, total, mean=None: None
        return
    with _bars_lock:
        entry = _bars.get(id(console))
        if entry is None:
            progress = _live(console)
            progress.start()
            entry = _bars[id(console)] = [progress, 0]
        entry[1] += 1
        progress = entry[0]
        task = progress.add_task(label, total=None)
    try:
        yield lambda done, total, mean=None: progress.update(task, completed=done, total=total or None, description=_bar_label(label, mean))
    finally:
        with _bars_lock:
            progress.remove_task(task)
            entry[1] -= 1
            if entry[1] == 0:
                progress.stop()
                del _bars[id(console)]


class ConsoleView:
    """The run as it happens, from the loop's events (evolver.events), from any thread.

    On a terminal: a live panel, the phase with its elapsed time, simulations done and the
    cost per role on the first row, a bar per evaluation in flight below it, results printed
    above. Otherwise (a log file): a timestamped line at every phase change, and one at
    least every ``every`` seconds while nothing else is said, so a log is never silent long."""

    def __init__(self, console: Console, every: float = 60.0):
        self.console, self.every = console, every
        self.lock = threading.Lock()
        self.phase, self.spent, self.limits = "starting", "", ""
        self.evals: dict[str, tuple[int, int]] = {}  # evaluation in flight -> (done, total)
        self.proposing: dict[str, str] = {}  # candidate being proposed -> its proposer's turn and last tool
        self.finished_sims = 0
        self.said = time.monotonic()
        self.live: Optional[Progress] = None
        self.rows: dict[str, object] = {}  # "" -> the phase row; evaluation name -> its bar
        self.ended = threading.Event()
        if not console.is_terminal:
            threading.Thread(target=self._heartbeat, name="run-log", daemon=True).start()

    def __call__(self, event: ev.Event) -> None:
        with self.lock:
            if isinstance(event, ev.Phase):
                self.phase = event.text
                self.proposing.clear()
                self._reset_phase_clock()
            elif isinstance(event, ev.Spent):
                self.spent = _spent_text(event)
            elif isinstance(event, ev.RateLimits):  # only lanes that are limited or have been: the others say nothing
                self.limits = " | ".join(
                    lane_text(lane, view)
                    for lane, view in sorted(event.lanes.items())
                    if view.get("rpm") or view.get("tpm") or view.get("limited") or view.get("waiting")
                )
            elif isinstance(event, ev.EvalProgress):
                self.evals[event.name] = (event.done, event.total, event.mean)
                if self.live is not None:
                    if event.name not in self.rows:
                        self.rows[event.name] = self.live.add_task(event.name, total=None)
                    self.live.update(
                        self.rows[event.name],
                        completed=event.done,
                        total=event.total or None,
                        description=_bar_label(event.name, event.mean),
                    )
            elif isinstance(event, ev.Proposing):
                self.proposing[event.label] = f"{event.label}: turn {event.turn} of at most {event.turns}, {event.doing}"
            elif isinstance(event, ev.EvalFinished):
                self.finished_sims += self.evals.pop(event.name, (0, 0, None))[0]
                if self.live is not None and event.name in self.rows:
                    self.live.remove_task(self.rows.pop(event.name))
            for line in _lines(event, self.console.is_terminal):
                self._say(line)
            if isinstance(event, ev.Ended):
                self._stop()
            else:
                self._refresh()

    def _say(self, line: str) -> None:
        (self.live.console if self.live is not None else self.console).print(line)
        self.said = time.monotonic()

    def _summary(self, each: bool = False) -> str:
        """The phase row; with ``each``, also every evaluation in flight (a log file has no bars)."""
        done = self.finished_sims + sum(d for d, _, _ in self.evals.values())
        parts = [self.phase, *[self.proposing[label] for label in sorted(self.proposing)], f"{done:,} simulations done"]
        if each:
            parts += [_bar_label(f"{name} {d}/{t}", mean) for name, (d, t, mean) in sorted(self.evals.items())]
        return " | ".join(parts + ([self.spent] if self.spent else []) + ([f"rate limits: {self.limits}"] if self.limits else []))

    def _refresh(self) -> None:
        if not self.console.is_terminal or self.ended.is_set():
            return
        if self.live is None:
            self.live = _live(self.console)
            self.live.start()
            self.rows[""] = self.live.add_task(self._summary(), total=None)
        self.live.update(self.rows[""], description=self._summary())

    def _reset_phase_clock(self) -> None:
        if self.live is not None:  # the phase row's clock counts this phase, e.g. how long the meta-LLM takes
            self.live.reset(self.rows[""], total=None)

    def _stop(self) -> None:
        self.ended.set()
        if self.live is not None:
            self.live.stop()
            self.live = None

    def _heartbeat(self) -> None:
        # Wake when the interval since the last line ends, not on a fixed tick that could
        # leave almost two intervals between lines.
        while not self.ended.wait(max(0.05, self.said + self.every - time.monotonic())):
            with self.lock:
                if time.monotonic() - self.said >= self.every:
                    self._say(f"{time.strftime('%H:%M:%S')} {self._summary(each=True)}")


def _spent_text(event: ev.Spent) -> str:
    """Tokens and dollars per role, and what is used of each budget the run has."""
    usage = event.usage.values()
    parts = [f"{role} {u.tokens:,} tok {cost_text([u])}" for role, u in sorted(event.usage.items())]
    if event.budget_usd:
        parts.append(f"${sum(u.cost for u in usage):.2f} of ${event.budget_usd:.2f} budget")
    if event.budget_tokens:
        parts.append(f"{sum(u.tokens for u in usage):,} of {event.budget_tokens:,} tokens budget")
    return ", ".join(parts)


def _lines(event: ev.Event, terminal: bool) -> list[str]:
    if isinstance(event, ev.Phase):  # a log file hears of every phase; a terminal sees the bars
        return [] if terminal else [f"{time.strftime('%H:%M:%S')} {event.text}"]
    if isinstance(event, ev.Baseline):
        return [f"baseline: analysis reward {fmt(event.analysis)}, gate reward {fmt(event.gate)}"]
    if isinstance(event, ev.NoiseFloor):
        where = f"with {event.tasks} gate tasks and {event.trials} trial(s) per task"
        if event.points is None:
            return [
                f"[yellow]warning:[/yellow] {where} no effect reaches 80% power: only a candidate that fixes nearly every gate task can be kept; add gate tasks or trials"
            ]
        lines = [f"noise floor: {where} the gate resolves effects of about {event.points:.1f} points (80% power)"]
        if 0 < event.min_effect_points < event.points:  # 0 means no minimum was asked for
            lines.append(
                f"[yellow]warning:[/yellow] the minimum effect ({event.min_effect_points:.1f} points) is below the noise floor; smaller gains will usually be rejected"
            )
        return lines
    if isinstance(event, ev.Estimate):
        return forecast_lines(
            event.forecast,
            event.seconds_per_simulation,
            event.concurrency,
            event.budget_usd,
            event.budget_tokens,
            "estimate of the rest of the run, priced by the baseline's simulations",
        )
    if isinstance(event, ev.Decided):
        colour = {"accepted": "green", "rejected": "red"}.get(event.status, "yellow")
        return [f"iteration {event.label}: [{colour}]{event.status}[/{colour}] {event.title or ''} - {event.reason}"]
    if isinstance(event, ev.Holdout):
        return [f"holdout: base {fmt(event.base)}, best {fmt(event.best)} (never used for any decision)"]
    if isinstance(event, ev.Ended) and event.how != "failed":
        return {
            "stopped": [f"[bold]stopped:[/bold] {event.reason}"],
            "paused": [
                f"[yellow]paused[/yellow]: the meta-LLM failed after retries ({event.reason}); "
                f"resume with `evolver run --resume {event.run_id}` once it is back"
            ],
            "interrupted": [f"[yellow]interrupted[/yellow]: resume with `evolver run --resume {event.run_id}`"],
        }[event.how]
    return []


def forecast_lines(
    fc, seconds: float, concurrency: int, budget_usd: float, budget_tokens: int, title: str, priced: bool = True
) -> list[str]:
    """A forecast (evolver.evolution.plan.Forecast) for people, ``seconds`` of wall clock per simulation at
    ``concurrency`` simulations at once: simulations and hours expected and at most,
    then per role tokens and dollars (unknown where a model has no known price), then the budgets."""
    hours = (fc.simulations * seconds / 3600, fc.simulations_most * seconds / 3600)
    lines = [
        f"{title}: about {fc.simulations:,} simulations expected, at most {fc.simulations_most:,}; "
        f"at {seconds:.2f} s of wall clock each ({concurrency} at once), about {hours[0]:.1f} h, up to {hours[1]:.1f} h; "
        f"{fc.proposals:,} proposal(s) at most"
    ]
    if not priced:
        lines.append("tokens and dollars of the simulations: measured on the baseline once it has run, or now with --pilot N")
    for role, (tokens, most, usd, usd_most) in fc.roles.items():
        if priced or role == "meta":
            cached = fc.meta_cached if role == "meta" else None
            with_cache = (
                (
                    f"; with the prompt cache ({CACHED_SHARE:.0%} of the prompt read from it): about {_dollars(cached[0])}, "
                    f"at most {_dollars(cached[1])}"
                )
                if cached
                else ""
            )
            lines.append(f"  {role}: about {tokens:,} tokens ({_dollars(usd)}), at most {most:,} ({_dollars(usd_most)}){with_cache}")
    total, total_most = fc.dollars(), fc.dollars(most=True)
    if budget_usd:
        verdict = "unknown" if total is None else "fits" if total <= budget_usd else "does not fit"
        lines.append(f"budget ${budget_usd:.2f}: the expected run {verdict} (expected {_dollars(total)}, at most {_dollars(total_most)})")
    if budget_tokens:
        lines.append(
            f"token budget {budget_tokens:,}: the expected run {'fits' if fc.tokens() <= budget_tokens else 'does not fit'} "
            f"(expected {fc.tokens():,}, at most {fc.tokens(most=True):,})"
        )
    return lines


def _dollars(usd) -> str:
    return "unknown" if usd is None else f"${usd:.2f}"


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def score(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def investigation_lines(stats: dict) -> list[str]:
    """What the proposer did, from its stats (evolver.evolution.proposers.ProposalResult.stats)."""
    lines = []
    if "turns" in stats:
        tools = ", ".join(f"{name} x{n}" for name, n in sorted(stats.get("tools", {}).items(), key=lambda kv: -kv[1]))
        lines.append(
            f"{stats['turns']} turn(s), {stats.get('tokens', 0):,} tokens, {stats.get('seconds', 0):g} s; ended: {stats.get('stopped', '?')}"
        )
        lines.append(f"tools: {tools or 'none'}")
        lines.append(f"edits applied: {stats.get('edits', 0)}, refused by validation: {stats.get('rejected_edits', 0)}")
        for t in stats.get("tries", []):
            rewards = ", ".join("n/a" if r is None else f"{r:.2f}" for r in t.get("rewards", []))
            lines.append(f"tried on {', '.join(t.get('tasks', []))}: rewards {rewards}")
    if "command" in stats:
        program = f"{stats['program']}; " if stats.get("program") else ""
        lines.append(
            f"command: {stats['command']} ({program}exit {stats.get('exit_code')}, {stats.get('seconds', 0):g} s)"
            + (f"; {stats['stopped']}" if stats.get("stopped") else "")
        )
        lines += [f"kept out: {k}" for k in stats.get("kept_out", [])] + [f"problem: {p}" for p in stats.get("problems", [])]
    for key in ("transcript", "log"):
        if stats.get(key):
            lines.append(f"{key}: {stats[key]}")
    return lines
