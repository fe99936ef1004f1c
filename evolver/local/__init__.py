"""The embedded local model: provisioning (provision), the llama.cpp server (server) and its chat
template's fix (template), the serving path (serving) with the user-role adapter (customer), and
backend, which serves it for the length of a command when a role needs it; and providers, which
registers evolver's litellm providers (this one and the scripted test provider).

It imports only the shared top-level modules; the evaluation side, the evolution side and the
command line import it.
"""
