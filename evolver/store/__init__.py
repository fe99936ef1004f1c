"""The run store: the run directory and its git lineage.

    rundir    a run (RunDir): run.json, state.json, each iteration, its evaluations by name, the
              proposals, the holdout, the event log, the lock that keeps two processes from
              driving one run; every write atomic; and finding runs under runs/
    runstate  a run's records (Manifest, RunState, IterationRecord), their schemas and migrations
    evaldir   one evaluation's folder (EvalDir): request, workers' states and claims, sims.jsonl,
              trajectories, worker.log, results, and which simulations are already measured
    records   reading a record: one line when it is damaged, its schema and named migrations
    lineage   a branch and a commit per candidate, the `best` branch, notes

No module outside it builds a path into runs/ (tests/test_run_paths.py). It imports only the
shared modules; the evaluation side writes each evaluation through it, the evolution side the
run, and the command line reads it.
"""
