"""The evolution side: one iteration at a time, propose candidates, check them, gate them,
keep at most one.

loop/ drives an iteration, a module per part of it, and emits typed events (evolver.events); digest condenses the
simulations the meta-LLM reads; propose asks it for a change and parses it into edits (patch),
which the static scan (evolver.evaluation.scan) checks; noop drops candidates that cannot
change anything; gate decides on real evidence; plan reads the run's gate and cost bound
from its configuration.

It imports the shared modules, the embedded model, the evaluation side (through its backends)
and the run store; never the command line.
"""
