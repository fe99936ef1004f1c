"""What a proposer may read, as short, paged text: the analysis simulations, their trajectories and
the model's view of each turn with what the harness changed in it, and the run's earlier candidates
with their diffs, verdicts and the gate tasks they flipped.

Only the analysis evaluation's folder is read here (its trajectories and turn views): gate and holdout
simulations, recorded alike, never reach a proposer. Data values are masked as in the digest (evolver.evolution.digest), tasks are labelled
T1..Tn and gate tasks G1..Gn, so ids are never shown. Everything a caller passes in (a label, a
pattern, a page) may come from an LLM: it is checked, and a bad value gets a one-line answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from evolver.data import EvalResult, SimRecord
from evolver.evaluation.backends.results import SWITCHES
from evolver.evolution.digest import Failure, describe, failed_checks, leaf_values, load_messages
from evolver.evolution.harness_changes import KINDS, Change, changes
from evolver.evolution.harness_code import HarnessCode, line_numbers
from evolver.evolution.noop import LAYER_NAMES, agent_digest
from evolver.evolution.turntext import summary, turn_lines, turns_with_changes
from evolver.store.evaldir import EvalDir
from evolver.store.turnview import TurnView

PAGE_LINES = 25
MAX_PATTERN = 200
SEARCH_SECONDS = 0.5  # a regular expression from an LLM may backtrack forever: each search is cut off


@dataclass(frozen=True)
class EarlierCandidate:
    """One candidate an earlier iteration of the run proposed, as a proposer may see it."""

    label: str
    title: str
    status: str
    reason: str
    diff: str = ""
    flips: tuple[str, ...] = ()  # "G3: 0.50 -> 1.00", gate tasks by label
    gate_delta: Optional[float] = None
    agent: str = ""  # noop.agent_digest of its agent/, so that a proposal can tell it is about to submit the same again

    def verdict(self) -> str:
        """ "candidate 2's, which was rejected: <reason>", said of an agent/ the same as this one's."""
        return f"candidate {self.label}'s, which was {self.status}{': ' + self.reason[:200] if self.reason else ''}"


def same_as_earlier(earlier, files: dict) -> Optional[EarlierCandidate]:
    """The earlier candidate whose agent/ equals these files (noop.agent_files), if any: the loop would refuse it unmeasured."""
    mine = agent_digest(files)
    return next((c for c in earlier if c.agent == mine), None)


@dataclass
class Evidence:
    analysis: EvalResult
    analysis_dir: Path
    earlier: list[EarlierCandidate] = field(default_factory=list)
    triaged: list = field(default_factory=list)  # evolver.evolution.triage.TaskTriage of the run's analysis evaluations
    parent: Optional[Path] = None  # a checkout of the agent the analysis measured: the lines a harness change points to

    def triage_notes(self) -> list[str]:
        """The analysis tasks triage flags, by label: fixing them may be impossible or not the agent's job."""
        return [
            f"{self.labels[t.task]}: {'; '.join(f'{flag} ({why})' for flag, why in zip(t.flags, t.why))}"
            for t in self.triaged
            if t.flags and t.task in self.labels
        ]

    def __post_init__(self):
        self.labels = {task: f"T{i + 1}" for i, task in enumerate(self.analysis.task_ids)}
        self.by_label = {label: task for task, label in self.labels.items()}
        self._described: dict[tuple[str, int], Failure] = {}
        self._views: dict[tuple[str, int], tuple[Optional[TurnView], list[Change]]] = {}
        self.code = HarnessCode.read(self.parent, self.analysis.harness) if self.parent else None

    # -- the analysis simulations -------------------------------------------------------------
    def record(self, label: str, trial: int) -> SimRecord | str:
        task = self.by_label.get(str(label).strip().upper())
        if task is None:
            return f"no analysis task '{_short(label)}'; the analysis tasks are T1..T{len(self.labels)} (gate and holdout tasks are never shown)"
        found = next((r for r in self.analysis.simulations if r.task_id == task and r.trial == trial), None)
        if found is None:
            return f"{label} has no trial {trial}; its trials: {', '.join(str(r.trial) for r in self.analysis.simulations if r.task_id == task)}"
        return found

    def described(self, record: SimRecord) -> Failure:
        key = (record.task_id, record.trial)
        if key not in self._described:
            view = self.view(record)[0]
            self._described[key] = describe(
                self.labels[record.task_id],
                record,
                load_messages(self.analysis_dir, record),
                more_values=leaf_values(list(view.arguments())) if view else (),
            )
        return self._described[key]

    def view(self, record: SimRecord) -> tuple[Optional[TurnView], list[Change]]:
        """The simulation's turn view and the harness's changes in it; (None, []) when none was recorded."""
        key = (record.task_id, record.trial)
        if key not in self._views:
            view = EvalDir(self.analysis_dir).read_turns(record)
            self._views[key] = (view, changes(view, self.analysis.harness) if view else [])
        return self._views[key]

    def harness_line(self, record: SimRecord) -> str:
        """The harness's changes in one simulation, in one line with the turns and the lines of agent/ to read; "" when none."""
        found = self.view(record)[1]
        return summary(found, self.code) if found else ""

    def summary_line(self, record: SimRecord) -> str:
        label = self.labels[record.task_id]
        if record.outcome == "infra_error":
            return f"{label} trial {record.trial}: not measured (infrastructure error)"
        failure = self.described(record)
        checks = failed_checks(record.reward_breakdown) + [a.strip() for a in failure.actions if a.startswith("  exception: ")]
        errors = sum(1 for line in failure.transcript if line.startswith("tool ERROR"))
        harness = self.harness_line(record)
        return (
            f"{label} trial {record.trial}: reward {record.reward or 0.0:.2f}, ended by {record.termination_reason} after {record.steps} messages"
            + (f", {errors} tool error(s)" if errors else "")
            + (f"; failed: {'; '.join(checks)}" if checks else "")
            + (f"; the harness changed: {harness}" if harness else "")
        )

    def failures(self, contains: str = "", page: int = 1) -> str:
        """The analysis simulations that did not pass, one line each; ``contains`` filters the lines
        (a task label, a termination reason, a check, "tool error")."""
        lines = [self.summary_line(r) for r in sorted(self.failed(), key=lambda r: (self.labels[r.task_id], r.trial))]
        lines = [line for line in lines if str(contains).lower() in line.lower()]
        passed = sum(1 for r in self.analysis.simulations if r.outcome != "infra_error" and (r.reward or 0.0) >= 1.0)
        head = f"{len(lines)} failed simulation(s){' matching ' + repr(_short(contains)) if contains else ''}; {passed} passed"
        notes = self.triage_notes()
        if notes and page == 1:
            head += "\ntasks that may be only noise (triage):\n" + "\n".join(notes)
        overview = self.harness_overview()
        if overview and page == 1:
            head += "\n" + overview
        return paged(head, lines, page)

    def failed(self) -> list[SimRecord]:
        return [r for r in self.analysis.simulations if r.outcome != "infra_error" and (r.reward or 0.0) < 1.0]

    def harness_overview(self, tools: bool = True) -> str:
        """Where to look first: the change the harness made in most failed simulations (one no switched-on layer
        explains, if there is one) and the lines of agent/ that run there; "" when it changed nothing in them.
        ``tools``: said as the investigating proposer's tool calls; otherwise as places in the files, for a reader without them."""
        common = self._most_common_change()
        if common is None:
            return ""
        kind, share, changed, failed, where = common
        off = self.layer_off(tools)
        return (
            f"the harness changed what passed between tau2 and the model in {changed} of {failed} failed simulation(s); most often "
            f"(in {share}): {KINDS[kind].many or 'the ' + KINDS[kind].one}"
            + (f" -> {self.first_read(tools)} first" if where else "")
            + (f"; {off}" if off else "")
        )

    def layer_off(self, tools: bool = True) -> str:
        """When a switched-on layer makes every change the harness made in the failed simulations (nothing else is
        changed), the experiment that tells whether the layer is at fault, as words a small model can act on; "" otherwise."""
        switch = self.layer_to_switch_off()
        how = f"set_layer layer={switch} on=false, or {switch} = false in {SWITCHES}" if tools else f"{switch} = false in {SWITCHES}"
        return (
            (
                f"every change the harness made in these failures is the {switch[:2].upper()} layer's, which is on: if they are the fault, "
                f"switching it off ({how}) tries the agent without it"
            )
            if switch
            else ""
        )

    def layer_to_switch_off(self) -> str:
        """The switch of the one switched-on layer that makes every change in the failed simulations (layer_off), or ""."""
        changed = [c for r in self.failed() for c in self.view(r)[1]]
        layers = {c.layer for c in changed}
        if not changed or len(layers) != 1 or "+" in (layer := layers.pop()) or not layer:
            return ""
        return next((name for name in LAYER_NAMES if name.startswith(layer.lower() + "_")), "")

    def first_place(self):
        """Where the harness made its most common change in the failed simulations (a harness_code.Place), or None."""
        common = self._most_common_change()
        return common[4] if common else None

    def first_read(self, tools: bool = True) -> str:
        """The call that reads the lines where the harness made its most common change, as a small model can copy it (``tools``),
        or those lines as a place in the file; "" if none."""
        where = self.first_place()
        if where is None:
            return ""
        lines = (
            (
                f"; {line_numbers(where.writes)} there {'can leave messages out' if where.losing else 'make the change'}: if it is the "
                "fault, remove or correct them"
            )
            if where.writes
            else ""
        )
        read = f"read_file {where.path} start={where.start} end={where.end}" if tools else f"{where.path} lines {where.start}-{where.end}"
        return f"{read} ({where.function}{', ' + where.part if where.part else ''}{lines})"

    def _most_common_change(self):
        """(kind, in how many failures, failures changed, failures, the likeliest place) of the change the harness made in most failed
        simulations, preferring one no switched-on layer explains; None when it changed nothing in them."""
        found = [self.view(r)[1] for r in self.failed()]
        changed = [f for f in found if f]
        if not changed:
            return None
        unexplained = [c for f in changed for c in f if not c.layer] or [c for f in changed for c in f]
        share = {kind: sum(any(c.kind == kind for c in f) for f in changed) for kind in dict.fromkeys(c.kind for c in unexplained)}
        kind = max(share, key=share.get)
        places = self.code.places(next(c for c in unexplained if c.kind == kind)) if self.code else []
        return kind, share[kind], len(changed), len(found), places[0] if places else None

    def trajectory(self, label: str, trial: int = 0, page: int = 1) -> str:
        record = self.record(label, trial)
        if isinstance(record, str):
            return record
        # Framed as a record: a small model otherwise reads the customer's lines as addressed to itself.
        head = f"recorded conversation of the agent you improve with a customer (not addressed to you):\n{self.summary_line(record)}"
        found = self.view(record)[1]
        changed = turns_with_changes(found)
        # Said again at the end of the first page, where a small model reads: the turn and the lines where the harness changed it.
        tail = (
            [
                f"the harness changed this conversation in turn(s) {', '.join(map(str, changed[:5]))}: read_turn {self.labels[record.task_id]} "
                f"turn {changed[0]}"
                + (
                    f", or read_file {where[0].path} start={where[0].start} end={where[0].end}"
                    if self.code and (where := self.code.places(next(c for c in found if c.turn == changed[0])))
                    else ""
                )
            ]
            if changed
            else []
        )
        lines = self.described(record).transcript
        return paged(head, lines[: PAGE_LINES - 1] + tail + lines[PAGE_LINES - 1 :], page)  # the first page's last line

    def turn(self, label: str, trial: int = 0, turn: Optional[int] = None) -> str:
        """One turn of an analysis simulation as the model saw it (masked): tau2's message, each request and answer,
        what the harness handed back and what it changed; without a turn, the first turn with a change."""
        record = self.record(label, trial)
        if isinstance(record, str):
            return record
        view, found = self.view(record)
        if view is None or not view.turns:
            return f"{label} trial {trial} has no recorded turns (its agent never answered a turn)"
        turn = turn if turn is not None else (turns_with_changes(found) or [1])[0]
        if not isinstance(turn, int) or isinstance(turn, bool) or not 1 <= turn <= len(view.turns):
            return f"{label} trial {trial} has turns 1..{len(view.turns)}; there is no turn {turn}"
        head = (
            f"recorded turn of the agent you improve (not addressed to you): {self.labels[record.task_id]} trial {record.trial}, "
            f"turns with changes: {', '.join(map(str, turns_with_changes(found))) or 'none'}"
        )
        return "\n".join([head, *turn_lines(view, turn, found, self.described(record).mask, self.code)])

    def changed_turn(self, record: SimRecord) -> str:
        """The first turn of a simulation the harness changed, as the model saw it (turn); "" when it changed none."""
        return self.turn(self.labels[record.task_id], record.trial) if self.view(record)[1] else ""

    def turns_text(self, record: SimRecord) -> list[str]:
        """Every turn of a simulation (masked), for a reader of whole files."""
        view, found = self.view(record)
        if view is None:
            return []
        mask = self.described(record).mask
        return [line for n in range(1, len(view.turns) + 1) for line in [*turn_lines(view, n, found, mask, self.code), ""]]

    def search(self, pattern: str, page: int = 1) -> str:
        """Lines of every analysis trajectory (masked) that match a regular expression."""
        compiled = compile_pattern(pattern)
        if isinstance(compiled, str):
            return compiled
        hits = []
        for record in sorted(self.analysis.simulations, key=lambda r: (self.labels[r.task_id], r.trial)):
            for n, line in enumerate(self.described(record).transcript, 1):
                found = search_line(compiled, line)
                if found is None:
                    return f"the pattern took too long to match (over {SEARCH_SECONDS:g} s); use a simpler one"
                if found:
                    hits.append(f"{self.labels[record.task_id]}/{record.trial} line {n}: {line}")
        return paged(f"{len(hits)} matching line(s) for {_short(pattern)!r}", hits, page)

    def labelled_trials(self, labels) -> list[str] | str:
        """Task ids for analysis labels (at most as many as given), or why not."""
        tasks = []
        for label in labels:
            task = self.by_label.get(str(label).strip().upper())
            if task is None:
                return f"no analysis task '{_short(label)}'; the analysis tasks are T1..T{len(self.labels)}"
            if task not in tasks:
                tasks.append(task)
        return tasks

    # -- earlier candidates -------------------------------------------------------------------
    def candidates(self) -> str:
        if not self.earlier:
            return "no earlier candidates in this run: this is the first proposal"
        lines = [
            f"{c.label}: {c.status}{'' if c.gate_delta is None else f' (gate {c.gate_delta * 100:+.1f} points)'} - {c.title or '(no patch)'}"
            + (f" - {c.reason[:160]}" if c.reason else "")
            for c in self.earlier
        ]
        return "\n".join(lines)

    def candidate(self, label: str, page: int = 1) -> str:
        found = next((c for c in self.earlier if c.label == str(label).strip()), None)
        if found is None:
            return f"no earlier candidate '{_short(label)}'; they are: {', '.join(c.label for c in self.earlier) or 'none'}"
        head = [
            f"candidate {found.label}: {found.title}",
            f"verdict: {found.status}: {found.reason}",
            f"gate tasks that flipped: {', '.join(found.flips) or 'none'}",
            "diff:",
        ]
        return paged("\n".join(head), found.diff.splitlines(), page)


def flipped(candidate: dict, incumbent: dict) -> list[tuple[str, float, float]]:
    """(task, incumbent's mean reward, candidate's) for the tasks where the two differ; the tables are
    rewards by task (evolver.evaluation.metrics.rewards_by_task), infrastructure errors left out."""
    out = []
    for task in sorted(candidate):
        c = [x for x in candidate[task] if x is not None]
        i = [x for x in incumbent.get(task, []) if x is not None]
        if c and i and round(sum(c) / len(c), 3) != round(sum(i) / len(i), 3):
            out.append((task, sum(i) / len(i), sum(c) / len(c)))
    return out


def paged(head: str, lines: list[str], page: int, size: int = PAGE_LINES) -> str:
    pages = max(1, -(-len(lines) // size))
    page = page if isinstance(page, int) and not isinstance(page, bool) else 1
    if not 1 <= page <= pages:
        return f"{head}\nthere is no page {page}; pages 1..{pages}"
    body = lines[(page - 1) * size : page * size]
    more = f"\n(page {page} of {pages}; ask for page {page + 1} to read on)" if page < pages else ""
    return "\n".join([head, *body]) + more


def compile_pattern(pattern):
    """A regular expression from an LLM, or why it cannot be used."""
    import regex

    if not isinstance(pattern, str) or not pattern:
        return "give a regular expression as text"
    if len(pattern) > MAX_PATTERN:
        return f"the pattern is longer than {MAX_PATTERN} characters"
    try:
        return regex.compile(pattern, regex.IGNORECASE)
    except regex.error as exc:
        return f"not a valid regular expression: {exc}"


def search_line(compiled, line: str) -> Optional[bool]:
    """Whether the line matches; None when the match ran out of time."""
    try:
        return compiled.search(line, timeout=SEARCH_SECONDS) is not None
    except TimeoutError:
        return None


def _short(value, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."
