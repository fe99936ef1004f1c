"""The run store: the run directory (runstate: run.json, state.json, each iteration, the
event log, the lock that keeps two processes from driving one run; every write atomic) and
its git lineage (lineage: a branch and a commit per candidate, the `best` branch, notes).

It imports only the shared modules; the evolution side writes it, the command line reads it.
"""
