"""The evaluation side: a candidate's agent/ in, its simulations and scores out.

The trusted evaluator (worker: tau2, the keys, the scoring; proxy_agent, its agent on the
trusted side) talks over a channel to the candidate's agent (agent_host), a separate process
confined by the sandbox and checked first by the static scan; the warm zygote (zygote,
zygote_client) forks both; backends/ run the evaluations on this machine or on Ray;
metrics summarises what they record.

It imports only the shared modules (evolver.config, data, ...) and the embedded model
(evolver.local); never the evolution side, the run store or the command line.
"""
