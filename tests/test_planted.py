"""The planted-fault benchmark counts a fix as a fix (benchmarks/planted_faults.py).

On its domain (tests/scripts/planted_domain.py), with H2 and H4 on, through `evolver eval` with the scripted
agent and customer and the real tau2: the template passes every gate and held-back task, each planted fault
fails them all, and each fault's fix (the scripted meta-agent's edits) is the template again. What a proposer
could keep instead scores below the fix and is counted as what it is: the turn method removed or a layer
switched off (reverted, read from the code), a window or a cut widened to the lengths the gate shows (fitted:
the held-back tasks go further), a narrower one (not recovered).
"""

from __future__ import annotations

import ast
import os

from benchmarks.planted_faults import git, label, make_repo, rewards, taken_out
from tests.scripts.planted import FAULTS, fixes, plant

FAULT = {f.name: f for f in FAULTS}
# gate, held back: what each candidate scores
SCORES = {
    "template": (1.0, 1.0),
    **{f.name: (0.0, 0.0) for f in FAULTS},
    "turn method removed": (0.4, 0.4),  # neither H2 nor H4 (tau2's LLMAgent answers): the plain tasks pass
    "H2 switched off": (0.6, 0.6),  # the completed and named tasks fail
    "H4 switched off": (0.8, 0.8),  # the stuck tasks fail
    "window [-3:]": (0.075, 0.1),  # only a single creation's conversation fits
    "window [-60:]": (1.0, 0.8),  # the gate's longest fits; 40 and 56 creations do not
    "cut [:250]": (1.0, 0.8),  # the gate's longest titles fit; 340 and 480 characters do not
}
# candidate: (the fault it was kept for, how it is counted, what it took out)
COUNTED = {
    "template": ("argument_coercion", "fixed", []),
    "turn method removed": ("dropped_tool_results", "reverted", ["the turn method removed"]),
    "H2 switched off": ("blocking_repair", "reverted", ["h2_action_realization switched off"]),
    "H4 switched off": ("early_stop", "reverted", ["h4_trajectory_regulation switched off"]),
    "window [-3:]": ("dropped_history", "not recovered", []),
    "window [-60:]": ("dropped_history", "fitted", []),
    "cut [:250]": ("rewritten_call", "fitted", []),
}


def without_turn_method(text: str) -> str:
    """The agent as `remove_lines` leaves it from the turn method's `def` line: the method gone whole."""
    turn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == "generate_next_message")
    lines = text.splitlines(keepends=True)
    return "".join(lines[: turn.lineno - 1] + lines[turn.end_lineno :])


def test_a_fix_outscores_a_revert_and_a_fit_and_each_is_counted_as_what_it_is(tmp_path):
    runtime = os.environ["EVOLVER_RUNTIME_DIR"]  # the test session's worker daemon
    repo = make_repo(tmp_path / "target", runtime)
    base = git(repo, "rev-parse", "HEAD").strip()
    template, switches = (repo / "agent" / "agent.py").read_text(), (repo / "agent" / "harness.toml").read_text()

    def commit(name: str, agent: str = template, toml: str = switches) -> str:
        git(repo, "checkout", "-q", "--detach", base)
        (repo / "agent" / "agent.py").write_text(agent)
        (repo / "agent" / "harness.toml").write_text(toml)
        git(repo, "commit", "-q", "--allow-empty", "-am", name)
        return git(repo, "rev-parse", "HEAD").strip()

    faulty = {f.name: plant(template, f) for f in FAULTS}
    for fix in fixes():  # each fault's fix gives the template back, so the template's score is the fix's
        fault = next(f for f in FAULTS if f.new == fix.old)
        fixed = faulty[fault.name]
        for old, new in [(fix.old, fix.new), *fix.more]:
            fixed = fixed.replace(old, new)
        assert fixed == template, fault.name
    commits = {"template": base, **{name: commit(name, text) for name, text in faulty.items()}}
    commits["turn method removed"] = commit("turn", without_turn_method(faulty["dropped_tool_results"]))
    commits["H2 switched off"] = commit(
        "h2", faulty["blocking_repair"], switches.replace("h2_action_realization = true", "h2_action_realization = false")
    )
    commits["H4 switched off"] = commit(
        "h4", faulty["early_stop"], switches.replace("h4_trajectory_regulation = true", "h4_trajectory_regulation = false")
    )
    for window in ("[-3:]", "[-60:]"):
        commits[f"window {window}"] = commit(window, faulty["dropped_history"].replace("state.messages[-2:]", f"state.messages{window}"))
    commits["cut [:250]"] = commit("cut", faulty["rewritten_call"].replace("v[:10]", "v[:250]"))

    scores = {name: rewards(repo, runtime, ref) for name, ref in commits.items()}
    measured = {name: (round(s["test"], 3), round(s["holdout"], 3)) for name, s in scores.items()}
    assert measured == SCORES, {name: f"{got}, not {SCORES[name]}" for name, got in measured.items() if got != SCORES[name]}
    for name, (fault, counted, removed) in COUNTED.items():
        assert taken_out(repo, commits[fault], commits[name]) == removed, name
        assert label(scores[name], scores[fault], scores["template"], removed) == counted, name
    assert label(None, scores["early_stop"], scores["template"], []) == "not recovered"  # nothing kept

    # A layer taken out inside the turn method is read from the code as well: H2's step no longer called.
    unrepaired = faulty["blocking_repair"].replace(
        "        if self.switches.h2_action_realization:\n            reply = self.realize_action(reply, context, state)\n", ""
    )
    assert unrepaired != faulty["blocking_repair"]
    assert taken_out(repo, commits["blocking_repair"], commit("unrepaired", unrepaired)) == [
        "realize_action (h2_action_realization) no longer called"
    ]
