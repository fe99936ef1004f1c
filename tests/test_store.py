"""The run store's interface (evolver/store/): one evaluation's folder (EvalDir), what a run charges
for its simulations, and the versioned run records with their named migrations. Offline, instant:
no worker, no tau2, no git."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from evolver.data import EvalRequest, EvalResult, EvalSummary, RoleModel, RoleUsage, SimRecord
from evolver.errors import UsageError
from evolver.store import runstate
from evolver.store.evaldir import EvalDir
from evolver.store.records import NewerSchema, migrate
from evolver.store.rundir import RunDir
from evolver.store.runstate import CandidateRecord, IterationRecord, RunState, charge

FIXTURE = Path(__file__).parent / "fixtures" / "old_run" / "run-45de20b.tar.gz"
ROLE = RoleModel(model="scripted/agent")


def _record(task: str, trial: int = 0, outcome: str = "ok", reward=1.0, **extra) -> SimRecord:
    return SimRecord(task_id=task, trial=trial, outcome=outcome, reward=None if outcome == "infra_error" else reward, **extra)


def _result(trials: int, note=None) -> EvalResult:
    summary = EvalSummary(
        num_tasks=1,
        num_trials=trials,
        num_simulations=trials,
        scored=trials,
        failed=0,
        infra_errors=0,
        avg_reward=1.0,
        pass_hat_k={},
        usage={},
        duration=2.0 * trials,
    )
    return EvalResult(
        run_id="r",
        checkout="/c",
        domain="mock",
        split=None,
        task_ids=["a"],
        trials=trials,
        seed=1,
        max_steps=3,
        models={},
        worker_note=note,
        summary=summary,
        simulations=[_record("a", t) for t in range(trials)],
    )


# ---- one evaluation's folder ---------------------------------------------------------


def test_sims_are_appended_whole_and_read_with_the_torn_line_and_retry_rules(tmp_path):
    evaluation = EvalDir(tmp_path / "e")
    evaluation.path.mkdir()
    evaluation.append_sim(_record("a", outcome="infra_error", error_role="agent"))
    evaluation.append_sim(_record("b", error="a line\u2028separator in the text").model_dump_json())  # a line as a Ray node sends it
    evaluation.append_sim(_record("a", reward=0.0))  # a's retry: the later line wins
    evaluation.append_sim(_record("d", outcome="infra_error", error_role="user"))
    with open(evaluation.sims_file, "a") as fh:
        fh.write('{"task_id": "c", "tri')  # a worker killed mid-write
    assert [(r.task_id, r.outcome, r.reward) for r in evaluation.records()] == [
        ("a", "ok", 0.0),
        ("b", "ok", 1.0),
        ("d", "infra_error", None),
    ]
    assert sorted(evaluation.measured()) == [("a", 0), ("b", 0)]  # an infrastructure error is measured again
    assert evaluation.lines_written() == 5
    assert EvalDir(tmp_path / "nothing").records() == [] and EvalDir(tmp_path / "nothing").lines_written() == 0


def test_a_tail_reads_only_complete_new_lines(tmp_path):
    evaluation = EvalDir(tmp_path)
    tail = evaluation.tail()
    assert tail.read() == []  # no file yet
    offset = evaluation.start_sims([_record("a").model_dump_json()])
    assert tail.read() == [_record("a").model_dump_json()] and tail.offset == offset
    line = _record("b").model_dump_json()
    with open(evaluation.sims_file, "a") as fh:
        fh.write(line[:10])
    assert tail.read() == []
    with open(evaluation.sims_file, "a") as fh:
        fh.write(line[10:] + "\n")
    assert tail.read() == [line] and evaluation.tail(offset).read() == [line]
    assert evaluation.tally().progress(4) == (2, 4, 1.0)


def test_trajectories_are_named_by_the_store_and_a_nodes_name_keeps_only_its_file_name(tmp_path):
    evaluation = EvalDir(tmp_path)
    evaluation.make_trajectories_dir()
    evaluation.write_trajectory(_record("t", 1), _result(1))  # a model, written as JSON
    mine = _record("t", 2)
    evaluation.write_trajectory(mine, "{}")  # text, written as it came
    assert mine.trajectory_file == "trajectories/t__trial2.json" and evaluation.read_trajectory(mine) == "{}"
    sent = _record("t", 3, trajectory_file="../../elsewhere/t__trial3.json")  # what a Ray node's record says
    evaluation.write_trajectory(sent, '{"messages": []}')
    assert sent.trajectory_file == "trajectories/t__trial3.json"
    assert sorted(p.name for p in evaluation.trajectories_dir.iterdir()) == ["t__trial1.json", "t__trial2.json", "t__trial3.json"]
    assert evaluation.read_trajectory(_record("t", 4)) is None


def test_a_new_or_resumed_evaluation_drops_the_last_workers_states_and_claims(tmp_path):
    evaluation = EvalDir(tmp_path / "e")
    req = EvalRequest(checkout="/c", out_dir=str(evaluation.path), domain="mock", agent=ROLE, user=ROLE, judge=ROLE)
    evaluation.begin(req)
    evaluation.write_status(1, "running", tasks=["a"])
    assert evaluation.read_status(1) == {"state": "running", "tasks": ["a"]} and evaluation.read_status(0) == {}
    evaluation.open_claims()
    assert evaluation.claim("a", 0) and not evaluation.claim("a", 0) and evaluation.claim("a", 1) and evaluation.claimed() == 2
    shard = evaluation.write_shard_request(req.model_copy(update={"shard": 1, "shards": 2}))
    assert shard.name == "request-1.json" and EvalRequest.model_validate_json(shard.read_text()).shard == 1
    evaluation.begin(req)
    assert evaluation.statuses() == [] and not evaluation.claims_dir.exists()
    assert EvalRequest.model_validate_json(evaluation.request_file.read_text()) == req
    evaluation.append_log("one\ntwo\n")
    assert evaluation.log_tail(4) == "two\n" and EvalDir(tmp_path / "none").log_tail(4) == ""


def test_a_result_is_kept_for_reuse_unless_a_worker_was_stopped(tmp_path):
    evaluation = EvalDir(tmp_path)
    assert evaluation.result(2) is None and evaluation.latest_result() is None and evaluation.measured_at() is None
    assert not evaluation.keep_result(_result(2, note="the worker was stopped at the wall-clock limit of 1 s"))
    assert evaluation.result(2) is None
    assert evaluation.keep_result(_result(2)) and evaluation.keep_result(_result(10))
    assert evaluation.result(2) == _result(2) and evaluation.latest_result().trials == 10  # by number: 10 after 2
    assert [p.name for p in evaluation.result_files()] == ["result-2.json", "result-10.json"]
    (tmp_path / "result-3.json").write_text("{")  # damaged: left out of the summaries, one line when read
    assert [s["duration"] for s in evaluation.summaries()] == [4.0, 20.0]
    with pytest.raises(UsageError, match="result-3.json is unreadable or corrupt"):
        evaluation.result(3)
    evaluation.write_result(_result(1))
    assert evaluation.result_file().name == "result.json" and evaluation.result() == _result(1)


# ---- what a run charges ----------------------------------------------------------------


def test_each_simulation_is_charged_once_and_a_retry_again():
    state = RunState(iterations_target=1, incumbent_commit="c")
    used = {"agent": RoleUsage(prompt_tokens=10, completion_tokens=1, cost=0.5)}
    first = [_record("a", usage=used), _record("b", outcome="infra_error", usage=used)]
    charge(state, "analysis-g0", first)
    charge(state, "analysis-g0", first)  # the same simulations again (a gate stage that grew the evaluation)
    assert state.usage["agent"].prompt_tokens == 20
    charge(state, "analysis-g0", [first[0], _record("b", usage=used)])  # b ran again after its infrastructure error
    assert state.usage["agent"].prompt_tokens == 30 and set(state.charged["analysis-g0"]) == {"a#0", "b#0"}
    record = IterationRecord(iteration=1, parent=0, parent_commit="c", generation=0)
    charge(record, "iter-001-gate", first)
    assert record.usage["agent"].prompt_tokens == 20 and state.usage["agent"].prompt_tokens == 30  # each holder its own


# ---- versioned records -----------------------------------------------------------------


def _old_run_files(*names: str) -> dict[str, dict]:
    """Files of the run in the 45de20b fixture (tests/fixtures/old_run/make.sh), as that evolver wrote them."""
    with tarfile.open(FIXTURE) as tar:
        members = {m.name.split("/", 3)[-1]: m for m in tar.getmembers() if m.name.startswith("target/runs/run-")}
        return {name: json.load(tar.extractfile(members[name])) for name in names}


def test_records_written_before_they_carried_a_schema_are_version_1_and_migrated_by_named_steps():
    old = _old_run_files("state.json", "iterations/003.json", "run.json")
    state, iteration = old["state.json"], old["iterations/003.json"]
    assert "schema" not in state and "schema" not in iteration and "schema" not in old["run.json"]
    assert runstate.STATE_MIGRATIONS == {1: runstate._state_v1_to_v2, 2: runstate._state_v2_to_v3, 3: runstate._state_v3_to_v4}
    assert runstate.ITERATION_MIGRATIONS == {1: runstate._iteration_v1_to_v2, 2: runstate._iteration_v2_to_v3}
    assert runstate._state_v1_to_v2(state) == state and runstate._iteration_v1_to_v2(iteration) == iteration  # nothing to change
    # Read through the steps, and written back: what the older evolver wrote, plus the version.
    again = json.loads(RunState.model_validate(state).model_dump_json())
    assert again.pop("rate_limits") == {}  # a field added since, empty: an older evolver ignores it
    assert again.pop("audits") == []  # v2 -> v3: no audit
    assert again.pop("pool") == [] and again.pop("best_label") is None  # v3 -> v4: no pool; its best named by iteration only
    for usage in again["usage"].values():  # fields added since, none: nothing was read from a prompt cache then, nor reported
        assert (usage.pop("cached_tokens"), usage.pop("cache_write_tokens"), usage.pop("cache_reported_tokens")) == (0, 0, 0)
    assert again == {"schema": 4, **state}
    again = json.loads(IterationRecord.model_validate(iteration).model_dump_json())
    candidates = again.pop("candidates")
    assert again.pop("rate_limits") == {}
    for usage in again["usage"].values():
        assert (usage.pop("cached_tokens"), usage.pop("cache_write_tokens"), usage.pop("cache_reported_tokens")) == (0, 0, 0)
    assert (again.pop("parent_label"), again.pop("minibatch"), again.pop("evidence")) == ("", [], "")  # v2 -> v3: a lineage's
    assert again == {"schema": 3, **{k: v for k, v in iteration.items() if k != "candidates"}}
    added = {"investigation": {}, "tries": [], "screen": {}, "gate_part": {}}  # the fields added since, empty
    assert candidates == [{**c, **added} for c in iteration["candidates"]]
    manifest = runstate.Manifest.model_validate(old["run.json"])  # run.json: its own steps, v1 -> ... -> v5
    assert manifest.schema_version == 5 and manifest.config["proposer"] == "oneshot" and "local_api_base" not in manifest.config
    assert manifest.config["agent_args"] == {} and manifest.config["learnings_file"] == ""  # v2 -> v3: no per-role argument
    assert manifest.config["rate_limits"] == {}  # v3 -> v4: no configured rate limit
    assert manifest.config["gate_policy"] == "per-decision" and manifest.policy == {}  # v4 -> v5: gated per decision, as then


def test_new_records_say_their_schema_first(tmp_path):
    run = RunDir(tmp_path, "run-x")
    run.path.mkdir(parents=True)
    run.save_state(RunState(iterations_target=3, incumbent_commit="c"))
    run.save_iteration(IterationRecord(iteration=1, parent=0, parent_commit="c", generation=0, candidates=[CandidateRecord(label="1")]))
    state = json.loads((run.path / "state.json").read_text())
    iteration = json.loads(run.iteration_file(1).read_text())
    assert list(state)[0] == "schema" and state["schema"] == runstate.STATE_SCHEMA == 4
    assert list(iteration)[0] == "schema" and iteration["schema"] == runstate.ITERATION_SCHEMA == 3
    assert run.state().schema_version == 4 and run.iterations()[0].schema_version == 3


@pytest.mark.parametrize("name, what", [("state.json", "state.json"), ("iterations/001.json", "the iteration record")])
def test_a_newer_record_is_refused_in_one_line(tmp_path, name, what):
    run = RunDir(tmp_path, "run-x")
    run.path.mkdir(parents=True)
    run.save_state(RunState(iterations_target=3, incumbent_commit="c"))
    run.save_iteration(IterationRecord(iteration=1, parent=0, parent_commit="c", generation=0))
    path = run.path / name
    known = runstate.STATE_SCHEMA if name == "state.json" else runstate.ITERATION_SCHEMA
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema": known + 1}))
    with pytest.raises(UsageError) as caught:
        run.state() if name == "state.json" else run.iterations()
    assert (
        str(caught.value) == f"{path}: {what} has schema {known + 1}, newer than this evolver knows ({known}); upgrade evolver to open it"
    )
    assert "\n" not in str(caught.value)


def test_migrations_run_in_order_from_the_records_version():
    steps = {1: lambda d: {**d, "a": 1}, 2: lambda d: {**d, "b": d["a"] + 1}}
    assert migrate({"x": 0}, "f", 3, steps) == {"x": 0, "a": 1, "b": 2, "schema": 3}
    assert migrate({"schema": 2, "a": 5}, "f", 3, steps) == {"schema": 3, "a": 5, "b": 6}
    assert migrate({"schema": 3}, "f", 3, steps) == {"schema": 3}
    with pytest.raises(NewerSchema, match="f has schema 'x', newer"):
        migrate({"schema": "x"}, "f", 3, steps)


def test_audits_as_written_while_they_were_dicts_load_typed_and_write_back_unchanged():
    """state.json's audits were plain dicts before they were records (runstate.Audit), with no schema change: a
    recorded audit (tests/fixtures/gate) reads as one and writes back the same; one from before audits recorded
    their label or the comparison its information reads too, judged by its iteration."""
    recorded = json.loads((Path(__file__).parent / "fixtures" / "gate" / "loop_audited_k1_keep_then_audit.json").read_text())["audits"]
    audits = [
        {"best": a["best"], "label": a["label"], "best_commit": "c0ffee", **{k: v for k, v in a.items() if k not in ("best", "label")}}
        for a in recorded
    ]
    older = {
        "best": 2,
        "best_commit": "abc123",
        "holds": False,
        "reason": "No evidence.",
        "looks": [{k: v for k, v in audits[0]["looks"][0].items() if k != "information"}],
    }
    state = {"schema": 4, "iterations_target": 3, "incumbent_commit": "c0ffee", "audits": [*audits, older]}
    read = RunState.model_validate(state)
    assert read.audits[0].holds and read.audits[0].looks[0].n_b_sims == 30 and read.audits[0].candidate == "1"
    assert read.audits[1].label is None and read.audits[1].candidate == "2" and read.audits[1].looks[0].information is None
    again = json.loads(read.model_dump_json())["audits"]
    assert again[0] == audits[0]  # what the dicts wrote, field for field
    assert again[1] == {**older, "label": None, "looks": [{**older["looks"][0], "information": None}]}
