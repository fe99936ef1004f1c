"""The gate's verdicts, replayed against fixtures recorded before the gate was split into a package.

tests/fixtures/gate/ holds the inputs and outputs tests/scripts/gate_capture.py recorded with the
code of the commit that added them: every stage's reward tables, the (sized) config and the
reference, and every verdict. Each case is put through today's code and must give the same
verdicts to the last bit: decisions, reasons, p-values, effects (the p-values are seeded by the
data, so they are deterministic). The loop cases also run the loop again with the fake backend
of tests/test_loop_policy.py and compare what it records, what it asks the backend for, and how a
killed run resumes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from evolver.evolution import gate as gatelib
from tests.scripts import gate_capture as capture

FIXTURES = Path(__file__).parent / "fixtures" / "gate"
CASES = {path.stem: json.loads(path.read_text()) for path in sorted(FIXTURES.glob("*.json"))}


def of_kind(*kinds: str) -> list[str]:
    return [name for name, case in CASES.items() if case["kind"] in kinds]


def judged(incumbent, candidates, config, stage, reference) -> dict:
    """decide_set on stored inputs, as JSON gives it back."""
    verdict = gatelib.decide_set(
        capture.decode(incumbent),
        {n: capture.decode(t) for n, t in candidates.items()},
        capture.config_of(config),
        stage=stage,
        reference=None if reference is None else capture.decode(reference),
    )
    return capture.plain(dataclasses.asdict(verdict))


def test_the_fixtures_cover_every_path():
    assert len(of_kind("set")) >= 10 and of_kind("single") and len(of_kind("loop")) >= 4 and of_kind("resume") and of_kind("power")
    reasons = " ".join(
        v["reason"]
        for name in of_kind("set")
        for stage in CASES[name]["stages"]
        for v in [stage["verdict"], *stage["verdict"]["verdicts"].values()]
    )
    for path in (
        "Accepted",
        "Rejected early",
        "within noise",
        "minimum effect",
        "broke",
        "Screened out",
        "no improvement",
        "no task has a valid screen trial",
    ):
        assert path in reasons, path
    assert any(len(CASES[name]["names"]) > 1 for name in of_kind("set"))
    statuses = {c["status"] for name in of_kind("loop") for it in CASES[name]["iterations"] for c in it["candidates"]}
    assert {"accepted", "rejected", "undecided"} <= statuses


@pytest.mark.parametrize("name", of_kind("set", "single"))
def test_each_stage_gives_the_recorded_verdict(name):
    case = CASES[name]
    stages = case["stages"] if case["kind"] == "set" else [case]
    for i, stage in enumerate(stages):
        got = judged(stage["incumbent"], stage["candidates"], case["config"], stage.get("stage", i), case["reference"])
        assert got == stage["verdict"], f"{name}, stage {i}"


@pytest.mark.parametrize("name", of_kind("set"))
def test_the_staged_driver_asks_for_the_recorded_stages_and_gives_the_recorded_verdicts(name):
    case = CASES[name]
    stages = iter(case["stages"])
    asked = []

    def run(stage):
        recorded = next(stages)
        asked.append([stage.incumbent_trials, stage.candidate_trials, list(stage.alive)])
        return capture.decode(recorded["incumbent"]), {n: capture.decode(t) for n, t in recorded["candidates"].items()}

    verdicts = gatelib.evaluate_set(
        case["names"],
        run,
        capture.config_of(case["config"]),
        reference=None if case["reference"] is None else capture.decode(case["reference"]),
    )
    assert asked == [stage["request"] for stage in case["stages"]]
    assert [capture.plain(dataclasses.asdict(v)) for v in verdicts] == [stage["verdict"] for stage in case["stages"]]


# The audited policy's screen is judged against the incumbent's history, not by decide_set, so its loop
# cases record no stage inputs: test_the_loop_records_what_it_recorded replays them as whole loops.
PER_DECISION_LOOPS = [name for name in of_kind("loop") if CASES[name]["settings"].get("gate_policy") == "per-decision"]


@pytest.mark.parametrize("name", PER_DECISION_LOOPS)
def test_the_loops_stages_give_the_recorded_verdicts(name):
    replayed = 0
    for iteration in CASES[name]["iterations"]:
        assert len(iteration.get("gate_inputs", [])) == len(iteration["gate_stages"]), f"{name}, iteration {iteration['iteration']}"
        for i, stage in enumerate(iteration.get("gate_inputs", [])):
            got = judged(stage["incumbent"], stage["candidates"], iteration["gate_config"], stage["stage"], iteration["reference"])
            assert got == iteration["gate_stages"][i], f"{name}, iteration {iteration['iteration']}, stage {i}"
            replayed += 1
    assert replayed, f"{name} records no gate stage to replay"


@pytest.mark.parametrize("name", of_kind("loop"))
def test_the_loop_records_what_it_recorded(name, tmp_path):
    """The whole loop again: the same evaluations asked for, the same tables given to the gate, the
    same records (gate_stages, every candidate's verdicts, statuses and reasons)."""
    case = CASES[name]
    again = capture.loop_case(name, case["proposals"], case["settings"], case["infra_marker"], case["outage"], tmp_path)
    assert again["evaluations"] == case["evaluations"]
    assert again["iterations"] == case["iterations"]
    assert again["audits"] == case.get("audits", [])  # none before the audited policy


@pytest.mark.parametrize("name", of_kind("resume"))
def test_a_killed_loop_resumes_as_it_did(name, tmp_path):
    case = CASES[name]
    [recipe] = [r for r in capture.RESUMES if r[0] == name]
    again = capture.resume_case(*recipe, tmp_path, compare=False)
    for key in ("evaluations_before_kill", "at_kill", "evaluations_after_resume", "iterations"):
        assert again[key] == case[key], key
    assert again["audits"] == case.get("audits", [])


def test_sizing_and_the_noise_floor_are_as_recorded():
    case = CASES["power"]
    small = capture.config_of(case["small_config"])
    assert {k: capture.plain(gatelib.set_stages(capture.CONFIG, int(k))) for k in case["set_stages"]} == case["set_stages"]
    for entry in case["references"]:
        reference = capture.decode(entry["table"])
        assert gatelib.pass_rates(reference) == entry["pass_rates"], entry["reference"]
        assert list(gatelib.sized(capture.CONFIG, reference).stages) == entry["sized"], entry["reference"]
        assert list(gatelib.sized(small, reference).stages) == entry["sized_small"], entry["reference"]
        if "shift_rates" in entry:
            assert gatelib.shift_rates(list(entry["pass_rates"].values()), 0.1) == entry["shift_rates"], entry["reference"]
        if "noise_floor" in entry:
            floor = gatelib.noise_floor(reference, gatelib.sized(small, reference), simulations=12)
            assert floor == entry["noise_floor"], entry["reference"]
