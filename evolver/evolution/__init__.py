"""The evolution side: one iteration at a time, propose candidates, check them, gate them,
keep at most one.

loop/ drives the run, a module per part of an iteration, and emits typed events (evolver.events);
proposers/ turn the evidence into a candidate (one completion, an investigating meta-LLM, or an
external coding agent); what they read: digest (the failing simulations, condensed and masked),
evidence (the analysis simulations and earlier candidates, paged), turntext with harness_changes and
harness_code (the model's view of a turn, what the harness changed in it and where in agent.py);
scratch is the copy a proposer edits, patch parses and applies edits under the allowlist, which
the static scan (evolver.evaluation.scan) checks; noop and dangling refuse candidates that cannot
change anything or leave names undefined; gate/ decides on real evidence; triage flags tasks that
are only noise; plan reads the run's gate and cost bound from its configuration.

It imports the shared modules (evolver.config, data, errors, events, kinds, llm, memo, models,
ratelimit), the embedded model's providers (evolver.local.providers), the evaluation side (backends,
metrics, the static scan; the sandbox and program folders for the command proposer) and the run
store; never the command line.
"""
