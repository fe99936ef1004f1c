"""A short markdown summary of a run, fit for a pull-request description."""

from __future__ import annotations

from evolver.cli.runreport.facts import RunFacts


def summary(f: RunFacts) -> str:
    best = f.best
    lines = [f"### evolver run `{f.run_id}`", ""]
    if best is None:
        lines.append(f"Nothing was kept: `{f.best_branch}` is the base ({f.base_commit[:10]}).")
    else:
        remeasured = f.best_remeasured()
        again = f", {remeasured:.3f} measured again" if remeasured is not None else ""
        lines.append(
            f"Best: **{best.label}** {best.title} (`{f.best_branch}`, {best.commit[:10] if best.commit else '-'}). "
            f"Gate score {_score(f.baseline_gate)} at the base, {_score(best.gate_candidate)} when kept{again}."
        )
    if f.holdout is not None:
        h = f.holdout
        lines.append(
            f"Holdout ({h['tasks']} sealed task(s) x {h['trials']} trial(s), never used for a decision): "
            f"base {_score(h['base'])} → best {_score(h['best'])}."
        )
    chain = " → ".join(["base"] + [f"{c.label} {c.title} ({_points(c.effect)})" for c in f.candidates if c.kept])
    path = "The best's path from the base" if f.population else "Kept lineage"
    lines += ["", f"{path}: {chain}.", "", "| candidate | title | gate (incumbent → candidate) | gain | verdict |", "|---|---|---|---|---|"]
    for c in f.candidates:
        title = (c.title or "(no patch)").replace("|", "\\|")
        lines.append(
            f"| {c.label}{' ★' if c.best else ''} | {title} | {_score(c.gate_incumbent)} → {_score(c.gate_candidate)} | {_points(c.effect)} | {c.verdict} |"
        )
    costs = ", ".join(
        f"{role} {cost.text()} ({cost.tokens:,} tokens{', ' + cost.cached_text() if cost.cached_text() else ''})"
        for role, cost in f.total_costs().items()
    )
    lines += [
        "",
        f"{f.iterations_done} of {f.iterations_target} iteration(s), {f.status}"
        + (f" ({f.stop_reason})" if f.stop_reason else "")
        + "; "
        + "; ".join(f.policy)
        + ".",
        f"Domain {f.domain}: {f.task_counts['gate']} gate tasks, {f.task_counts['analysis']} analysis, {f.task_counts['holdout']} holdout. "
        f"Models: {', '.join(f'{role} {model}' for role, model in f.models.items())}.",
        f"Cost: {costs or 'none recorded'}.",
    ]
    if best is not None:
        lines += ["", f"Adopt it with `git merge {f.best_branch}`."]
    return "\n".join(lines) + "\n"


def _score(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _points(effect) -> str:
    return "-" if effect is None else f"{effect * 100:+.1f} points"
