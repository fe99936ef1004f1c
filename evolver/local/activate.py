"""Importing this module registers the `local/` litellm provider.

It exists so the provider can be switched on in a process evolver does not
control line by line, e.g. as a worker plugin: EvalRequest(plugins=["evolver.local.activate"]).
"""

from evolver.llm import prepare_environment
from evolver.local import serving

prepare_environment()
serving.register()
