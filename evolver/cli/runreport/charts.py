"""The report's charts (plotly figures) from RunFacts: scores, lineage, cost, the task grid."""

from __future__ import annotations

from collections import defaultdict

import plotly.graph_objects as go

from evolver.cli.runreport.facts import OUTSIDE_ITERATIONS, Candidate, RunFacts

# One look per verdict, in the score chart and the lineage alike.
STYLE = {
    "accepted": ("#2e7d32", "circle"),
    "rejected": ("#c62828", "x"),
    "undecided": ("#ef6c00", "diamond"),
    "evaluating": ("#1565c0", "circle-dot"),  # a run still going: on the gate now
    "proposing": ("#9e9e9e", "circle-open-dot"),
    "invalid": ("#9e9e9e", "diamond-open"),
    "refused": ("#9e9e9e", "circle-open"),
    "no_patch": ("#9e9e9e", "square-open"),
}
ROLE_COLOURS = {"agent": "#1565c0", "user": "#6a1b9a", "judge": "#00838f", "meta": "#ef6c00"}
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50), font=dict(size=13))


def score_chart(facts: RunFacts) -> go.Figure:
    """Gate score of every candidate measured on the gate, against the incumbent it faced; error bars
    mirror the gate's one-sided lower confidence bound on the gain (a two-sided 1 - 2 alpha interval)."""
    fig = go.Figure()
    bar = [(0, facts.baseline_gate)] + sorted({(c.iteration, c.gate_incumbent) for c in facts.candidates if c.gate_incumbent is not None})
    fig.add_trace(
        go.Scatter(
            x=[x for x, _ in bar],
            y=[y for _, y in bar],
            mode="lines+markers",
            name="incumbent (gate)",
            line=dict(color="#424242", width=2),
            marker=dict(size=7),
        )
    )
    analysis = [(0, facts.baseline_analysis)] + [(c.iteration, c.analysis) for c in facts.candidates if c.kept and c.analysis is not None]
    fig.add_trace(
        go.Scatter(
            x=[x for x, _ in analysis],
            y=[y for _, y in analysis],
            mode="lines+markers",
            name="incumbent (analysis)",
            line=dict(color="#757575", width=1.5, dash="dot"),
            marker=dict(size=6, symbol="square"),
        )
    )
    gated = [c for c in facts.candidates if c.gate_candidate is not None]
    offsets = _offsets(gated)
    for status in ("accepted", "rejected", "undecided", "evaluating"):
        group = [c for c in gated if c.status == status]
        if not group:
            continue
        colour, symbol = STYLE[status]
        fig.add_trace(
            go.Scatter(
                x=[c.iteration + offsets[c.label] for c in group],
                y=[c.gate_candidate for c in group],
                mode="markers+text",
                name={"accepted": "kept", "evaluating": "on the gate now"}.get(status, status),
                text=[c.label for c in group],
                textposition="middle right",
                marker=dict(color=colour, symbol=symbol, size=12, line=dict(width=1.5, color=colour)),
                error_y=dict(type="data", array=[_half_width(c) for c in group], visible=True, color=colour, thickness=1.2),
                customdata=[[c.title, c.reason] for c in group],
                hovertemplate="%{text}: %{customdata[0]}<br>gate %{y:.3f}<br>%{customdata[1]}<extra></extra>",
            )
        )
    fig.update_layout(**LAYOUT, title="Gate and analysis scores per iteration", height=420, legend=dict(orientation="h", y=-0.18))
    fig.update_xaxes(title="iteration (0: base)", dtick=1, rangemode="tozero")
    fig.update_yaxes(title="mean reward", range=[-0.05, 1.08])
    return fig


def lineage_chart(facts: RunFacts) -> go.Figure:
    """Every candidate as a node on its parent: kept ones on the lanes of the lineage, the others below."""
    pos = {"base": (0, 0.0)}
    lanes_used = {0}
    kept_children = defaultdict(int)
    below = defaultdict(int)
    for c in facts.candidates:
        px, py = pos.get(c.parent, (0, 0.0))
        if c.kept:
            lane = (
                py if kept_children[c.parent] == 0 else max(lanes_used) + 1
            )  # a second kept child (after a rollback) gets a lane of its own
            kept_children[c.parent] += 1
            lanes_used.add(lane)
            pos[c.label] = (c.iteration, lane)
        else:
            below[c.iteration] += 1
            pos[c.label] = (c.iteration, -below[c.iteration])
    fig = go.Figure()
    for kept in (False, True):
        xs, ys = [], []
        for c in facts.candidates:
            if c.kept == kept:
                (x0, y0), (x1, y1) = pos.get(c.parent, (0, 0.0)), pos[c.label]
                xs += [x0, x1, None]
                ys += [y0, y1, None]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                hoverinfo="skip",
                showlegend=False,
                line=dict(color="#2e7d32" if kept else "#bdbdbd", width=3 if kept else 1),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[0],
            y=[0],
            mode="markers+text",
            name="base",
            text=["base"],
            textposition="top center",
            marker=dict(color="#424242", size=14, symbol="square"),
            hovertemplate=f"base<br>{facts.base_branch or 'detached'} {facts.base_commit[:10]}<extra></extra>",
        )
    )
    by_status = defaultdict(list)
    for c in facts.candidates:
        by_status[c.status].append(c)
    for status, group in by_status.items():
        colour, symbol = STYLE.get(status, ("#9e9e9e", "circle-open"))
        fig.add_trace(
            go.Scatter(
                x=[pos[c.label][0] for c in group],
                y=[pos[c.label][1] for c in group],
                mode="markers+text",
                name={"accepted": "kept"}.get(status, status.replace("_", " ")),
                text=[c.label for c in group],
                textposition=["top center" if c.kept else "bottom center" for c in group],
                marker=dict(color=colour, symbol=symbol, size=14 if status == "accepted" else 11, line=dict(width=1.5, color=colour)),
                customdata=[[c.title or "(no patch)", c.branch or "no branch", (c.commit or "")[:10]] for c in group],
                hovertemplate="%{text}: %{customdata[0]}<br>%{customdata[1]} %{customdata[2]}<extra></extra>",
            )
        )
    bx, by = pos.get(facts.best_label, (0, 0.0))
    fig.add_annotation(
        x=bx,
        y=by,
        text=f"best: {facts.best_branch}",
        showarrow=True,
        arrowhead=2,
        ax=0,
        ay=-50,
        standoff=28,
        font=dict(color="#2e7d32"),
        bgcolor="white",
    )
    low = min(y for _, y in pos.values())
    fig.update_layout(
        **LAYOUT,
        title="Lineage: every candidate on its parent, the kept ones joined",
        height=int(230 + 55 * (max(lanes_used) - low)),
        legend=dict(orientation="h", y=-0.15),
    )
    fig.update_xaxes(title="iteration", dtick=1, range=[-0.5, max([x for x, _ in pos.values()] + [1]) + 0.6])
    fig.update_yaxes(visible=False, range=[low - 0.6, max(lanes_used) + 1.2])
    return fig


def cost_chart(facts: RunFacts) -> go.Figure:
    """Dollars per iteration by role; tokens instead when no role has a known price."""
    roles = facts.roles()
    priced = [r for r in roles if any(row.roles.get(r) and row.roles[r].usd for row in facts.costs)]
    unknown = [r for r in roles if any(row.roles.get(r) and row.roles[r].usd is None and row.roles[r].tokens for row in facts.costs)]
    names = [row.name if row.iteration is None else str(row.iteration) for row in facts.costs]
    fig = go.Figure()
    for role in priced or roles:
        usage = [row.roles.get(role) for row in facts.costs]
        values = [0 if u is None else (u.usd or 0.0) if priced else u.tokens for u in usage]
        fig.add_trace(go.Bar(x=names, y=values, name=role, marker_color=ROLE_COLOURS.get(role)))
    if priced:
        title = "Cost per iteration by role (USD)" + (f"; price unknown for {', '.join(unknown)}" if unknown else "")
    else:
        title = "Tokens per iteration by role (no role has a known price)"
    fig.update_layout(**LAYOUT, title=title, barmode="stack", height=360, legend=dict(orientation="h", y=-0.25))
    fig.update_xaxes(title=f"iteration ('{OUTSIDE_ITERATIONS}': outside the iterations)", type="category")
    fig.update_yaxes(title="USD" if priced else "tokens")
    return fig


def rate_limit_chart(facts: RunFacts) -> go.Figure:
    """Per iteration and provider endpoint and model: 429s answered (bars) and seconds spent waiting for a
    turn in the rate limit (line, right axis)."""
    names = [OUTSIDE_ITERATIONS if iteration is None else str(iteration) for iteration, _ in facts.rate_limits]
    lanes = sorted({lane for _, row in facts.rate_limits for lane in row})
    fig = go.Figure()
    for lane in lanes:
        counts = [row.get(lane, {}) for _, row in facts.rate_limits]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[c.get("limited", 0) for c in counts],
                name=f"{lane}: 429s",
                customdata=[c.get("calls", 0) for c in counts],
                hovertemplate="%{y} 429s of %{customdata} calls<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=names, y=[round(c.get("waited", 0.0), 1) for c in counts], name=f"{lane}: s waited", yaxis="y2", mode="lines+markers"
            )
        )
    fig.update_layout(
        **LAYOUT,
        title="Rate limits per iteration: 429s answered and seconds waited for a turn",
        height=360,
        legend=dict(orientation="h", y=-0.25),
        yaxis2=dict(title="seconds waited", overlaying="y", side="right", rangemode="tozero"),
    )
    fig.update_xaxes(title=f"iteration ('{OUTSIDE_ITERATIONS}': outside the iterations)", type="category")
    fig.update_yaxes(title="429s", rangemode="tozero")
    return fig


def task_grid(facts: RunFacts) -> go.Figure:
    """Pass rate per gate task and candidate; ▲/▼ where a candidate's rate rose/fell against its incumbent's."""
    grid = facts.grid
    marks = [["▲" if f > 0 else "▼" if f < 0 else "" for f in row] for row in grid.flips]
    fig = go.Figure(
        go.Heatmap(
            z=grid.rates,
            x=grid.columns,
            y=grid.tasks,
            text=marks,
            texttemplate="%{text}",
            zmin=0,
            zmax=1,
            colorscale=[[0, "#ef9a9a"], [0.5, "#fff59d"], [1, "#a5d6a7"]],
            colorbar=dict(title="pass rate"),
            xgap=2,
            ygap=1,
            hovertemplate="%{y} / %{x}: pass rate %{z:.2f} %{text}<extra></extra>",
        )
    )
    fig.update_layout(
        **LAYOUT,
        title="Pass rate per gate task: the base, then each candidate measured on the gate (▲▼: flipped against its incumbent)",
        height=max(300, 140 + 18 * len(grid.tasks)),
    )
    fig.update_layout(margin=dict(t=90))
    fig.update_xaxes(type="category", side="top")
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def _half_width(c: Candidate):
    return None if c.effect is None or c.ci_low is None else c.effect - c.ci_low


def _offsets(candidates: list[Candidate]) -> dict[str, float]:
    """Spread the candidates of one iteration side by side so their markers do not hide each other."""
    by_iteration = defaultdict(list)
    for c in candidates:
        by_iteration[c.iteration].append(c.label)
    out = {}
    for labels in by_iteration.values():
        for i, label in enumerate(labels):
            out[label] = (i - (len(labels) - 1) / 2) * 0.15
    return out
