"""Scripted behaviours for the Ray backend's tests (selected with EVOLVER_SCRIPT)."""

import os

from evolver.scripted import mock_script

KEY = "RAYTEST_API_KEY"
VALUE = "sk-raytest-for-the-trusted-side-only"


def needs_key(name, messages, tools):
    """A provider that needs its key, as a hosted one does: a worker without RAYTEST_API_KEY in its
    environment fails every call (an infrastructure error, never a score)."""
    if os.environ.get(KEY) != VALUE:
        import litellm  # here, in the worker: the tests import this module for its names

        raise litellm.AuthenticationError(message=f"{KEY} is not set", llm_provider="scripted", model=f"scripted/{name}")
    return mock_script(name, messages, tools)
