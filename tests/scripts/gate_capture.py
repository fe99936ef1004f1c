"""Records the gate's verdicts as fixtures for tests/test_gate_replay.py.

    python -m tests.scripts.gate_capture tests/fixtures/gate [CASE ...]

The committed fixtures were recorded with the code of the commit that added them, before the
gate was split into a package (the script has since followed evaluate_set's new signature); the
replay test asserts that today's code gives the same verdicts. Recording them again after a
change defeats that purpose: run this only to check that a change reproduces them (into another
directory, then diff).

Three kinds of case:

* set_*.json: scripted reward tables (seeded draws) put through the staged gate for one or
  several candidates, every stage's inputs and SetVerdict kept;
* loop_*.json: the real loop with the fake backend of tests/test_loop_policy.py, every
  decide_set call it made (inputs, sized config, reference, verdict; per-decision runs), and what
  the iteration records, the audits and the backend saw (evaluations by name and seed); some
  killed mid-gate or mid-audit and resumed. loop_audited_* (the audited policy, the default since
  they were recorded) were added later: name cases to record only those;
* power.json: sized(), pass_rates(), shift_rates() and noise_floor() on a few references.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import tempfile
from pathlib import Path

import pytest

from evolver.evolution import gate as gatelib

CONFIG = gatelib.GateConfig()


# ---------------------------------------------------------------- encoding


def encode(table) -> dict:
    """A reward table in JSON: a task's trials as a string ("1" pass, "0" fail, "-" infrastructure
    error) when they are all 0/1/None, as a list otherwise."""
    out = {}
    for task, rewards in table.items():
        if all(r in (0.0, 1.0, None) for r in rewards):
            out[task] = "".join("-" if r is None else str(int(r)) for r in rewards)
        else:
            out[task] = list(rewards)
    return out


def decode(table: dict) -> dict:
    return {task: [None if ch == "-" else float(ch) for ch in v] if isinstance(v, str) else list(v) for task, v in table.items()}


def config_dict(config: gatelib.GateConfig) -> dict:
    return dataclasses.asdict(config)


def config_of(data: dict) -> gatelib.GateConfig:
    return gatelib.GateConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def plain(value):
    """A value as JSON gives it back (tuples become lists)."""
    return json.loads(json.dumps(value, allow_nan=False))


def dump(path: Path, data: dict) -> None:
    """One line per top-level key, one line per list item below it: small files that still diff."""
    lines = ["{"]
    items = list(data.items())
    for i, (key, value) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value:
            lines.append(f"{json.dumps(key)}: [")
            lines += [json.dumps(v, separators=(",", ":")) + ("," if j < len(value) - 1 else "") for j, v in enumerate(value)]
            lines.append("]" + end)
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value, separators=(',', ':'))}{end}")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- scripted sets


def draw(rng: random.Random, rates: list[float], trials: int, errors: float = 0.0, values=(0.0, 1.0)) -> dict:
    """Trials per task at these pass rates; with `values` beyond 0/1, a pass draws its reward from them."""

    def one(p):
        if errors and rng.random() < errors:
            return None
        if rng.random() >= p:
            return values[0]
        return values[-1] if len(values) == 2 else rng.choice(values[1:])

    return {f"t{i:02d}": [one(p) for _ in range(trials)] for i, p in enumerate(rates)}


def drive_set(config, names, incumbent, tables, reference):
    """The staged gate over fixed tables: every stage's request, inputs and verdict."""
    stages, current = [], {name: {t: [] for t in tables[name]} for name in tables}

    def run(stage):
        inc_trials, cand_trials, alive = stage.incumbent_trials, stage.candidate_trials, stage.alive
        for name in alive:
            current[name] = {t: r[:cand_trials] for t, r in tables[name].items()}
        seen = {t: r[:inc_trials] for t, r in incumbent.items()}
        stages.append(
            {
                "request": [inc_trials, cand_trials, list(alive)],
                "incumbent": encode(seen),
                "candidates": {n: encode(t) for n, t in current.items()},
            }
        )
        return seen, {n: dict(t) for n, t in current.items()}

    verdicts = gatelib.evaluate_set(names, run, config, reference=reference)
    for stage, verdict in zip(stages, verdicts):
        stage["verdict"] = plain(dataclasses.asdict(verdict))
    assert len(stages) == len(verdicts)
    return stages


def set_case(name, config, names, incumbent, tables, reference=None, *, check):
    stages = drive_set(config, names, incumbent, tables, reference)
    last = stages[-1]["verdict"]
    assert check(last), (name, last["reason"])
    return {
        "name": name,
        "kind": "set",
        "config": config_dict(config),
        "names": list(names),
        "reference": None if reference is None else encode(reference),
        "stages": stages,
    }


def single_case(name, config, stage, incumbent, tables, reference=None, *, check):
    """One decide_set call out of turn (a caller replaying a stage)."""
    verdict = gatelib.decide_set(incumbent, tables, config, stage=stage, reference=reference)
    out = plain(dataclasses.asdict(verdict))
    assert check(out), (name, out["reason"])
    return {
        "name": name,
        "kind": "single",
        "config": config_dict(config),
        "stage": stage,
        "reference": None if reference is None else encode(reference),
        "incumbent": encode(incumbent),
        "candidates": {n: encode(t) for n, t in tables.items()},
        "verdict": out,
    }


def first_seed(build, check):
    """The first seed whose case takes the path `check` asks for (the search is part of the recipe)."""
    for seed in range(200):
        try:
            return build(seed, check)
        except AssertionError:
            continue
    raise AssertionError(f"no seed gives the path asked for: {build.__qualname__}")


def kept(v):
    return v["decided"] and v["kept"] is not None


def reason_has(text):
    return lambda v: v["decided"] and v["kept"] is None and text in v["reason"]


def set_cases() -> list[dict]:
    cases = []
    n = 12
    gate_trials = CONFIG.stages[-1]
    run_trials = CONFIG.screen + gate_trials

    def k1(name, shift, *, config=CONFIG, errors=0.0, values=(0.0, 1.0), reference=True, check, tasks=n):
        def build(seed, check):
            rng = random.Random(f"{name}:{seed}")
            rates = [rng.random() for _ in range(tasks)]
            moved = gatelib.shift_rates([min(max(p, 0.01), 0.99) for p in rates], shift) if shift else rates
            ref = draw(rng, rates, 6, errors, values) if reference else None
            inc = draw(rng, rates, config.stages[-1], errors, values)
            cand = draw(rng, moved, config.stages[-1], errors, values)
            return set_case(name, config, ["7"], inc, {"7": cand}, ref, check=check)

        cases.append(first_seed(build, check))

    k1("set_k1_accept", 0.35, check=kept)
    k1("set_k1_early_stop", -0.3, check=lambda v: reason_has("Rejected early")(v) and v["stage"] == 0)
    k1("set_k1_late_stop", 0.0, check=lambda v: reason_has("Rejected early")(v) and v["stage"] >= 2)
    k1("set_k1_within_noise", 0.05, check=reason_has("within noise"))
    k1("set_k1_min_effect", 0.35, config=dataclasses.replace(CONFIG, min_effect=0.45), check=reason_has("below the minimum effect"))
    k1("set_k1_errors", 0.3, errors=0.15, check=kept)
    k1(
        "set_k1_fractional",
        0.2,
        values=(0.0, 0.25, 0.5, 0.75, 1.0),
        config=dataclasses.replace(CONFIG, permutations=1000),
        check=lambda v: v["decided"] and v["verdicts"]["7"]["p_value"] is not None,
    )
    k1("set_k1_no_reference", 0.3, reference=False, check=lambda v: v["decided"] and v["verdicts"]["7"]["final"])
    one_look = dataclasses.replace(CONFIG, stages=(4,), futility=())
    k1("set_k1_one_look_no_improvement", -0.05, config=one_look, check=reason_has("no improvement"))
    k1("set_k1_one_look_exact", 0.25, config=one_look, errors=0.1, check=lambda v: v["verdicts"]["7"]["p_value"] is not None)
    fine_grid = dataclasses.replace(CONFIG, stages=(9,), futility=())  # 7, 8 and 9 valid trials: lcm 504, past the exact grid
    k1(
        "set_k1_one_look_rounded_grid",
        0.2,
        config=fine_grid,
        errors=0.12,
        check=lambda v: v["verdicts"]["7"]["p_value"] is not None and 0.001 < v["verdicts"]["7"]["p_value"] < 1,
    )

    # A reliable task broken by an otherwise clearly better candidate.
    rng = random.Random("set_k1_regression")
    inc = draw(rng, [0.5] * 12 + [1.0] * 4, gate_trials)
    cand = draw(rng, [0.95] * 12 + [1.0] * 3 + [0.0], gate_trials)
    cand["t15"][0] = 1.0  # passes its first trial: only the final look can see the break
    cases.append(
        set_case(
            "set_k1_regression",
            CONFIG,
            ["7"],
            inc,
            {"7": cand},
            draw(rng, [0.5] * 12 + [1.0] * 4, 6),
            check=lambda v: reason_has("broke 1 of")(v),
        )
    )

    # Several candidates: a screen, then the winner's gate.
    def kmany(name, shifts, *, check, errors=0.0, blank=None):
        def build(seed, check):
            rng = random.Random(f"{name}:{seed}")
            rates = [rng.random() for _ in range(n)]
            safe = [min(max(p, 0.01), 0.99) for p in rates]
            names = [f"3{chr(97 + j)}" for j in range(len(shifts))]
            tables = {nm: draw(rng, gatelib.shift_rates(safe, s) if s else rates, run_trials, errors) for nm, s in zip(names, shifts)}
            if blank:
                tables[blank] = {t: [None] * run_trials for t in tables[blank]}
            return set_case(name, CONFIG, names, draw(rng, rates, gate_trials, errors), tables, draw(rng, rates, 6, errors), check=check)

        cases.append(first_seed(build, check))

    kmany("set_k3_screen_accept", [0.0, 0.35, 0.0], check=lambda v: v["kept"] == "3b")
    kmany("set_k2_screen_early_stop", [-0.3, -0.3], check=lambda v: reason_has("Rejected early")(v) and v["stage"] == 1)
    kmany("set_k4_noops", [0.0] * 4, errors=0.05, check=lambda v: v["decided"] and v["kept"] is None and v["stage"] >= 3)
    kmany("set_k2_no_valid_screen", [0.2, 0.0], blank="3b", check=reason_has("no task has a valid screen trial"))

    rng = random.Random("set_k2_regression")
    inc = draw(rng, [0.5] * 12 + [1.0] * 4, gate_trials)
    good = draw(rng, [0.95] * 12 + [1.0] * 3 + [0.0], run_trials)
    good["t15"][:3] = [1.0, 1.0, 1.0]  # passes its screen and first gate trial of the task it breaks
    other = draw(rng, [0.5] * 16, run_trials)
    cases.append(set_case("set_k2_regression", CONFIG, ["3a", "3b"], inc, {"3a": other, "3b": good}, None, check=reason_has("broke 1 of")))

    # Out of turn: the final stage asked of results the first look stops (the replay of the looks stops there).
    rng = random.Random("single_k1_would_have_stopped")
    inc = draw(rng, [0.5] * n, gate_trials)
    for rewards in inc.values():
        rewards[0] = 1.0
    late = {t: [0.0] + [1.0] * (gate_trials - 1) for t in inc}
    cases.append(
        single_case(
            "single_k1_would_have_stopped",
            CONFIG,
            len(CONFIG.stages) - 1,
            inc,
            {"7": late},
            check=lambda v: v["kept"] is None and v["verdicts"]["7"]["stage"] == 0,
        )
    )
    mid = len(gatelib.set_stages(CONFIG, 2)) - 3
    inc_mid, cand_mid = gatelib.set_stages(CONFIG, 2)[mid]
    rng = random.Random("single_k2_mid_stage")
    tables = {nm: draw(rng, [0.7] * n, cand_mid) for nm in ("3a", "3b")}
    cases.append(
        single_case(
            "single_k2_mid_stage",
            CONFIG,
            mid,
            draw(rng, [0.5] * n, inc_mid),
            tables,
            draw(rng, [0.5] * n, 6),
            check=lambda v: not v["decided"] and v["alive"],
        )
    )
    return cases


# ---------------------------------------------------------------- loops

LOOPS = [
    # name, proposals, settings, infra marker (a candidate whose agent says it gets only errors),
    # outage (evaluation, from its n-th request on only errors)
    ("loop_k1_accept_then_reject", "exact,note1", {"gate_policy": "per-decision", "iterations": 2}, None, None),
    ("loop_k2_screen", "exact+thorough", {"gate_policy": "per-decision", "iterations": 1, "candidates": 2}, None, None),
    ("loop_k1_undecided", "worse,note1,note2", {"gate_policy": "per-decision", "iterations": 6, "stall": 2}, "Note 1", None),
    # The screen's winner meets an outage from its second gate stage on: undecided, with the screen's verdicts on record.
    (
        "loop_k2_undecided_candidate",
        "note1+exact",
        {"gate_policy": "per-decision", "iterations": 1, "candidates": 2},
        None,
        ("iter-001b-gate", 2),
    ),
    ("loop_k1_incumbent_outage", "exact", {"gate_policy": "per-decision", "iterations": 1}, None, ("iter-001-incumbent", 2)),
    # the audited policy (the default): the screen against the incumbent's history, the lenient gate, the audit
    ("loop_audited_k1_keep_then_audit", "exact,note1,worse", {"iterations": 3}, None, None),
    ("loop_audited_k2_screen", "exact+thorough,note1+worse", {"iterations": 2, "candidates": 2}, None, None),
]


def record_calls(monkeypatch) -> list:
    """Every decide_set call the loop's gate makes from here on (not noise_floor's): its inputs and verdict."""
    calls = []
    original = gatelib.decide_set

    def recording(incumbent, candidates, config, *, stage, reference=None):
        verdict = original(incumbent, candidates, config, stage=stage, reference=reference)
        if _within("gate_candidates"):
            calls.append(
                {
                    "stage": stage,
                    "config": plain(config_dict(config)),
                    "reference": None if reference is None else encode(reference),
                    "incumbent": encode(incumbent),
                    "candidates": {n: encode(t) for n, t in candidates.items()},
                    "verdict": plain(dataclasses.asdict(verdict)),
                }
            )
        return verdict

    for module in [m for name, m in sys.modules.items() if name == gatelib.__name__ or name.startswith(gatelib.__name__ + ".")]:
        if getattr(module, "decide_set", None) is original:
            monkeypatch.setattr(module, "decide_set", recording)
    return calls


def _within(function: str) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def iteration_facts(run, calls: list | None = None) -> list[dict]:
    """What the loop kept of its gate decisions, iteration by iteration (run: a RunDir). With the
    gate's decide_set calls, each iteration also gets the inputs of its stages: the sized config
    and reference once, then each stage's tables (the verdict of stage i is gate_stages[i])."""
    out, calls = [], list(calls or [])
    for r in run.iterations():
        facts = plain(
            {
                "iteration": r.iteration,
                "status": r.status,
                "reason": r.reason,
                "kept": r.kept,
                "gate_incumbent": r.gate_incumbent,
                "gate_stages": r.gate_stages,
                "candidates": [
                    {"label": c.label, "status": c.status, "reason": c.reason, "gate_candidate": c.gate_candidate, "verdicts": c.verdicts}
                    for c in r.candidates
                ],
            }
        )
        mine, calls = calls[: len(r.gate_stages)], calls[len(r.gate_stages) :]
        if mine:
            assert [c["verdict"] for c in mine] == facts["gate_stages"]
            assert all(c["config"] == mine[0]["config"] and c["reference"] == mine[0]["reference"] for c in mine)
            facts["gate_config"], facts["reference"] = mine[0]["config"], mine[0]["reference"]
            facts["gate_inputs"] = [{"stage": c["stage"], "incumbent": c["incumbent"], "candidates": c["candidates"]} for c in mine]
        out.append(facts)
    assert not calls, "a decide_set call outside the recorded stages"
    return out


def audits_of(run) -> list[dict]:
    """The run's audits as recorded, but for the audited commit (its hash differs from one recording to the next)."""
    return plain([audit.model_dump(exclude={"best_commit"}) for audit in run.state().audits])


class Killed(KeyboardInterrupt):
    """Ctrl-C, raised by the backend: the run stops as a killed one does, mid-evaluation."""


def watched(backend, stop_at: tuple[str, int] | None = None, outage: tuple[str, int] | None = None):
    """The backend, noting every evaluation asked of it as (name, trials, seed). With stop_at =
    (name, n), the n-th request of that evaluation stops the run instead; with outage = (name, n),
    its n-th request and later ones are all infrastructure errors."""
    evaluate, backend.asked = backend.evaluate, []

    def noted(req, run_id, **kwargs):
        name = Path(req.out_dir).name
        nth = sum(a[0] == name for a in backend.asked) + 1
        if stop_at is not None and name == stop_at[0] and nth == stop_at[1]:
            raise Killed
        backend.asked.append([name, req.trials, req.seed])
        if outage is not None and name == outage[0] and nth >= outage[1]:
            return evaluate(req, run_id, outage=True, **kwargs)  # this request only: the incumbent beside it is untouched
        return evaluate(req, run_id, **kwargs)

    backend.evaluate = noted
    return backend


def asked(backend) -> list:
    """The evaluations asked of the backend, sorted: candidates and the incumbent run at once, in any order."""
    return sorted(backend.asked)


def loop_case(name, proposals, settings, marker, outage, tmp: Path) -> dict:
    from tests.test_loop_policy import FakeBackend, run_loop

    with pytest.MonkeyPatch.context() as mp:
        # decide_set's inputs, stage by stage, where it judges every stage (the audited policy's screen is not decide_set's)
        calls = record_calls(mp) if settings.get("gate_policy") == "per-decision" else None
        backend = watched(FakeBackend(infra_marker=marker), outage=outage)
        loop = run_loop(tmp / name, mp, proposals, backend, **settings)
    return {
        "name": name,
        "kind": "loop",
        "proposals": proposals,
        "settings": settings,
        "infra_marker": marker,
        "outage": outage,
        "evaluations": asked(backend),
        "iterations": iteration_facts(loop.run, calls),
        "audits": audits_of(loop.run),
    }


RESUMES = [
    # name, proposals, settings, (evaluation, its n-th request stops the run), what the end is
    (
        "loop_k1_killed_mid_gate",
        "exact",
        {"gate_policy": "per-decision", "iterations": 1},
        ("iter-001-gate", 2),
        "Killed as the gate's second stage starts (the first on disk); the resumed run reuses it and ends as an uninterrupted one.",
    ),
    (
        "loop_k2_killed_after_screen",
        "exact+thorough",
        {"gate_policy": "per-decision", "iterations": 1, "candidates": 2},
        ("iter-001b-gate", 3),
        "Killed after the screen and the first gate stage. The resumed run replays the gate from the screen on the "
        "evaluations on disk (the screened-out candidate enters again), so the winner is confirmed on fresh trials and the "
        "run ends as the uninterrupted one (loop_k2_screen). Recorded again after that fix: before it, the winner was gated "
        "alone on resume and its screen trials were reused as its first gate trials.",
    ),
    (
        "loop_audited_killed_mid_audit",
        "exact",
        {"iterations": 1},
        ("audit-001-best", 1),
        "Killed as the audit's first look of the best starts (the base's trials on disk; the look decides, as the "
        "uninterrupted run's does); the resumed run replays the audit and ends as an uninterrupted one.",
    ),
]


def resume_case(name, proposals, settings, at, note, tmp: Path, *, compare: bool = True) -> dict:
    """An iteration killed mid-gate, then resumed; with `compare`, also run uninterrupted to check the note."""
    from rich.console import Console

    from evolver.cli.start import resume_run
    from evolver.store.rundir import RunDir
    from tests.test_loop_policy import FakeBackend, run_loop

    with pytest.MonkeyPatch.context() as mp:
        whole = run_loop(tmp / f"{name}-whole", mp, proposals, FakeBackend(), **settings) if compare else None
        killed = watched(FakeBackend(), stop_at=at)
        try:
            run_loop(tmp / name, mp, proposals, killed, **settings)
        except Killed:
            pass
        else:
            raise AssertionError(f"the run never asked for {at}")
        run = RunDir(tmp / name / "target", "run-policy")
        at_kill = iteration_facts(run)
        again = watched(FakeBackend())
        loop = resume_run(run, {}, Console(quiet=True), lambda cfg: again)
        loop.drive()
    end = iteration_facts(loop.run)
    assert whole is None or (end == iteration_facts(whole.run) and audits_of(loop.run) == audits_of(whole.run)) == (
        "does NOT" not in note
    ), name
    return {
        "name": name,
        "kind": "resume",
        "note": note,
        "proposals": proposals,
        "settings": settings,
        "killed_at": list(at),
        "evaluations_before_kill": asked(killed),
        "at_kill": at_kill,
        "evaluations_after_resume": asked(again),
        "iterations": end,
        "audits": audits_of(loop.run),
    }


# ---------------------------------------------------------------- power and sizing


def power_case() -> dict:
    rng = random.Random("power")
    references = {
        "steady": {f"t{i:02d}": [float(i % 2)] * 6 for i in range(16)},
        "coins": draw(rng, [0.5] * 16, 6),
        "uniform": draw(rng, [rng.random() for _ in range(24)], 6),
        "errors": draw(rng, [rng.random() for _ in range(20)], 6, errors=0.2),
        "few": draw(rng, [0.5] * 6, 4),
    }
    small = gatelib.GateConfig(stages=(2, 4), futility=(0.0,), max_regressions=10**6)
    out = []
    for name, reference in references.items():
        entry = {
            "reference": name,
            "table": encode(reference),
            "pass_rates": gatelib.pass_rates(reference),
            "sized": list(gatelib.sized(CONFIG, reference).stages),
            "sized_small": list(gatelib.sized(small, reference).stages),
        }
        rates = list(entry["pass_rates"].values())
        if all(0 < p < 1 for p in rates):
            entry["shift_rates"] = gatelib.shift_rates(rates, 0.1)
        if name != "steady":
            entry["noise_floor"] = gatelib.noise_floor(reference, gatelib.sized(small, reference), simulations=12)
        out.append(entry)
    return {
        "name": "power",
        "kind": "power",
        "small_config": config_dict(small),
        "set_stages": {str(k): plain(gatelib.set_stages(CONFIG, k)) for k in (1, 2, 3)},
        "references": out,
    }


def main(out: Path, only: set[str] | None = None) -> None:
    """Record every case in `out`, or only the named ones (new cases, without recording the others again)."""
    out.mkdir(parents=True, exist_ok=True)
    if only:
        with tempfile.TemporaryDirectory() as tmp:
            for name, *rest in LOOPS:
                if name in only:
                    dump(out / f"{name}.json", loop_case(name, *rest, Path(tmp)))
            for name, *rest in RESUMES:
                if name in only:
                    dump(out / f"{name}.json", resume_case(name, *rest, Path(tmp)))
        return
    for case in set_cases():
        dump(out / f"{case['name']}.json", case)
    dump(out / "power.json", power_case())
    with tempfile.TemporaryDirectory() as tmp:
        for name, *rest in LOOPS:
            dump(out / f"{name}.json", loop_case(name, *rest, Path(tmp)))
        for name, *rest in RESUMES:
            dump(out / f"{name}.json", resume_case(name, *rest, Path(tmp)))


if __name__ == "__main__":
    main(Path(sys.argv[1]), set(sys.argv[2:]))
