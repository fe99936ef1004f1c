"""Scripted LLM behaviours used by tests and benchmarks (EVOLVER_SCRIPT=tests.scripts.<module>:<function>)."""
