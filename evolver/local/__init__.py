"""The embedded local model: provisioning, the llama.cpp server, and its serving path; and
providers, which registers evolver's litellm providers (this one and the scripted test provider).

It imports only the shared top-level modules; the evaluation side, the evolution side and the
command line import it.
"""
