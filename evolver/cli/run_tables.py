"""The tables of a run's records in the terminal (rich): history, one candidate, status, every run, transfers.
Live progress and the run's events are evolver.cli.console's."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from evolver.cli.console import fmt, infra_line, investigation_lines, lane_text, score
from evolver.data import RoleUsage, cost_text


def transfer_table(rows: list[dict]) -> Table:
    """Does the kept harness carry to other models: a row per compared pair (evolver.cli.compare.transfer_rows)."""
    table = Table(title="transfers", title_justify="left")
    for col in ("agent model", "user model", "domain", "pair", "A", "B", "effect (interval)", "verdict"):
        table.add_column(col, overflow="fold")
    for r in rows:
        colour = {"helps": "green", "hurts": "red"}.get(r["verdict"], "yellow")
        effect = (
            "-"
            if r["effect"] is None
            else f"{100 * r['effect']:+.1f}" + (f" ({100 * r['ci'][0]:+.1f} to {100 * r['ci'][1]:+.1f})" if r["ci"] else "")
        )
        table.add_row(
            r["agent_model"],
            r["user_model"],
            r["domain"],
            r["pair"],
            score(r["a"]),
            score(r["b"]),
            effect,
            f"[{colour}]{r['verdict']}[/{colour}]",
        )
    return table


def history_table(run_id: str, rows: list[dict]) -> Table:
    table = Table(title=f"evolver history {run_id}", title_justify="left")
    for col in ("cand", "branch", "parent", "title", "analysis", "gate (inc -> cand)", "delta", "verdict", "reason", "cost"):
        table.add_column(col, overflow="fold")
    for r in rows:
        colour = {"accepted": "green", "joined": "green", "rejected": "red"}.get(r["verdict"], "yellow")
        delta = "-" if r["gate_delta"] is None else f"{r['gate_delta']:+.3f}"
        table.add_row(
            f"{r['candidate']}{' *' if r['is_best'] else ''}",
            r["branch"] or "-",
            str(r["parent"]),
            r["title"] or "-",
            score(r["analysis"]),
            f"{score(r['gate_incumbent'])} -> {score(r['gate_candidate'])}",
            delta,
            f"[{colour}]{r['verdict']}[/{colour}]",
            r["reason"],
            (r["cost"] or "") + "".join(f"; {role} {text}" for role, text in (r.get("cached") or {}).items()),
        )
    return table


def show_candidate(console: Console, info: dict) -> None:
    """One candidate, or each candidate of an iteration that had several."""
    if "candidates" in info:
        joined = [c["label"] for c in info["candidates"] if c.get("joined")]
        outcome = f"joined the pool: {', '.join(joined) or 'none'}" if info.get("parent_label") else f"kept {info['kept'] or 'none'}"
        console.print(
            f"[bold]iteration {info['iteration']}[/bold]: {len(info['candidates'])} candidates from {info.get('parent_label') or 'the incumbent'}, "
            f"{outcome}  [{info['status']}]\n"
        )
        for cand in info["candidates"]:
            show_candidate(console, cand)
            console.print()
        return
    standing = " (joined the pool)" if info.get("joined") else ""
    standing += ", the run's best" if info.get("best") else ""
    console.print(f"[bold]candidate {info['label']}[/bold]: {info['title'] or '(no patch)'}  [{info['status']}]{standing}")
    console.print(
        f"branch {info['branch'] or '-'}  commit {info['commit'] or '-'}  parent {'base' if info['parent'] == 0 else info['parent']}"
    )
    console.print(f"verdict: {info['reason']}")
    if info.get("evidence"):
        console.print(f"evidence: {info['evidence']}", markup=False, highlight=False)
    if info.get("investigation"):
        console.print("\n[bold]investigation[/bold]")
        for line in investigation_lines(info["investigation"]):
            console.print(line, markup=False, highlight=False)
    if info["rationale"]:
        console.print("\n[bold]rationale[/bold]\n" + info["rationale"])
    if info["diff"]:
        console.print("\n[bold]diff[/bold]")
        console.print(info["diff"], markup=False, highlight=False)
    if info["flips"]:
        console.print("\n[bold]gate tasks whose pass rate changed[/bold]")
        for f in info["flips"]:
            console.print(f"  {f['task']}: {f['incumbent']:.2f} -> {f['candidate']:.2f}")


def status_table(info: dict) -> Table:
    """`evolver status` for people: one row per fact, no Python reprs."""
    table = Table(title=f"evolver status {info['run_id']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    colour = {"running": "green", "dead": "red", "paused": "yellow", "interrupted": "yellow"}.get(info["status"], "")
    table.add_row("status", f"[{colour}]{info['status']}[/{colour}]" if colour else info["status"])
    if info["step"]:
        table.add_row("doing", info["step"])
    if info["stop_reason"]:
        table.add_row("stopped because", info["stop_reason"])
    table.add_row(
        "iterations",
        f"{info['iterations_done']} of {info['iterations_target']}"
        + (f", {info['candidates_per_iteration']} candidates each" if info["candidates_per_iteration"] > 1 else ""),
    )
    best = info["best"]
    table.add_row(
        "best",
        f"{'base' if best['iteration'] == 0 else 'iteration ' + str(best['iteration'])} (gate {fmt(best['gate'])}), {best['branch']}",
    )
    if info.get("policy"):  # what the gate policy promised and did (history.policy_lines)
        table.add_row("gate policy", "\n".join(info["policy"]))
    table.add_row("simulations", f"{info['simulations_done']:,} done, at most {info['simulations_planned_at_most']:,} in all")
    for role, tally in sorted(info["infra_errors"].items()):
        table.add_row("infrastructure errors", infra_line(role, tally["count"], tally["first"]))
    for lane, view in sorted(info.get("rate_limits", {}).items()):
        table.add_row("rate limit", lane_text(lane, view, live="waiting" in view))
    table.add_row("elapsed", _duration(info["elapsed_seconds"]))
    if info["eta_seconds_at_most"] is not None:
        table.add_row(
            "time left",
            f"at most {_duration(info['eta_seconds_at_most'])} (at the measured {info['seconds_per_simulation']:.1f} s per simulation)",
        )
    for role, usage in sorted(info["usage"].items()):
        u = RoleUsage(**usage)
        table.add_row(
            f"{role}",
            f"{u.prompt_tokens:,} in / {u.completion_tokens:,} out tokens, {cost_text([u])}"
            + (f", {u.cached_text()}" if u.cached_text() else ""),
        )
    table.add_row("cost", info["cost_text"])
    table.add_row("models", ", ".join(f"{role} {model}" for role, model in info["models"].items()))
    for t in info.get("transfers", []):
        table.add_row(
            "transfer",
            f"{t['agent_model']} ({t['domain']}): {t['pair']} {t['verdict']}"
            + ("" if t["effect"] is None else f", {100 * t['effect']:+.1f} points"),
        )
    table.add_row("tasks", info["split_note"])
    return table


def runs_table(rows: list[dict]) -> Table:
    table = Table(title="evolver runs", title_justify="left")
    for col in ("run", "status", "domain", "iterations", "best (gate)", "cost"):
        table.add_column(col)
    for r in rows:
        if "reason" in r:  # a folder that holds no run
            table.add_row(r["run_id"], r["reason"], "", "", "", "")
            continue
        best = r["best"]
        table.add_row(
            r["run_id"],
            r["status"],
            r["domain"],
            f"{r['iterations_done']}/{r['iterations_target']}",
            f"{'base' if best['iteration'] == 0 else best['iteration']} ({fmt(best['gate'])})",
            r["cost_text"],
        )
    return table


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min" if seconds >= 3600 else f"{seconds // 60} min {seconds % 60:02d} s"
