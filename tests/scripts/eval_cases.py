"""Scripted behaviours for the evaluation tests (selected with EVOLVER_SCRIPT)."""

import litellm

from evolver.scripted import mock_script


def flaky_provider(name, messages, tools):
    """The agent's provider is down whenever the customer asks to delete tasks."""
    if name == "agent" and any("delete" in str(m.get("content") or "").lower() for m in messages if m.get("role") == "user"):
        raise litellm.ServiceUnavailableError(message="scripted outage", llm_provider="scripted", model="scripted/agent")
    return mock_script(name, messages, tools)


def idle_agent(name, messages, tools):
    """The agent only talks: no task is ever created, so the mock domain's environment
    assertions about the task the customer wanted raise inside tau2's evaluation."""
    if name == "agent":
        from evolver.scripted import Reply

        return Reply(content="Done: success.")  # the scripted customer then stops
    return mock_script(name, messages, tools)
