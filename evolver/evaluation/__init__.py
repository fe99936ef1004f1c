"""The evaluation side: a candidate's agent/ in, its simulations and scores out.

The trusted evaluator (worker: tau2, the keys, the scoring; proxy_agent, its agent on the
trusted side) talks over a channel to the candidate's agent (agent_host), a separate process
confined by the sandbox and checked first by the static scan; the warm zygote (zygote,
zygote_client) forks both; backends/ run the evaluations on this machine or on Ray;
metrics summarises what they record; turnlog writes each simulation's turn view; program_folders
says which programs a sandboxed process may run; tau2_compat fits the tau2 version installed.

It imports the shared modules (evolver.data, errors, kinds, llm, ratelimit), the embedded model's
providers (evolver.local.providers) and, of the run store, only what one evaluation writes: its
folder (evolver.store.evaldir) and the turn view (evolver.store.turnview). Never the run's records
(store.rundir, store.runstate), the evolution side or the command line.
"""
