"""The run store: the run directory and its git lineage.

    rundir    a run (RunDir): run.json, state.json, each iteration, its evaluations by name, the
              proposals, the holdout, the event log, the lock that keeps two processes from
              driving one run; every write atomic; and finding runs under runs/
    runstate  a run's records (Manifest, RunState with its Audits, IterationRecord), their schemas and migrations
    evaldir   one evaluation's folder (EvalDir): request, workers' states and claims, sims.jsonl,
              trajectories, worker.log, results, and which simulations are already measured
    records   reading a record: one line when it is damaged, its schema and named migrations
    turnview  a simulation's turn view: what tau2 gave the harness and what the model was sent, turn by turn
    comparisons  the folder of an `evolver compare` and of an `evolver transfer`
    lineage   a branch and a commit per candidate, the `best` branch, notes

No module outside it builds a path into runs/ (tests/test_run_paths.py). It imports only the
shared modules (evolver.data, errors) and gitpython; the evaluation side writes each evaluation
through it (evaldir, turnview), the evolution side the run, and the command line reads it.
"""
