"""What a worker imports and runs once before its first simulation: done in the zygote, before it forks
workers, so that every worker starts warm."""

from __future__ import annotations

from evolver.llm import prepare_environment


def preload() -> None:
    """Import what every worker needs (the zygote does this once, before forking)."""
    prepare_environment()
    import tomllib  # noqa: F401 - what the agent template imports besides tau2

    import landlock  # noqa: E401, F401 - an agent process confines itself right after the fork
    import litellm  # noqa: F401
    import loguru  # noqa: F401
    import tau2.environment.tool  # noqa: F401 - the agent process's stand-in tools
    import tau2.evaluator.evaluator_nl_assertions  # noqa: F401
    import tau2.run  # noqa: F401
    import tenacity  # noqa: F401 - evolver.llm.retrying

    import evolver.evaluation.agent_host  # noqa: E401, F401
    import evolver.evaluation.proxy_agent
    import evolver.evaluation.sandbox
    import evolver.toolcalls

    evolver.evaluation.sandbox.prepare()
    evolver.evaluation.agent_host.prepare()
    _warm_completion_path()


class _Inline:
    """Stands in for litellm's logging executor during the warm-up: runs its callbacks here, so no thread starts."""

    @staticmethod
    def submit(fn, *args, **kwargs):
        fn(*args, **kwargs)


def _warm_completion_path() -> None:
    """One completion with tools through tau2's generate and litellm, answered by a throwaway
    provider: litellm imports some 280 modules (its MCP handler, provider configs, the
    tokenizer) on its first call, about 0.6 s of CPU that every forked worker paid again
    before its first simulation. Idempotent, offline, and it leaves no thread behind (the
    zygote forks, so it must have none)."""
    import litellm
    import litellm.utils
    import tau2.utils.llm_utils as llm_utils
    from litellm import CustomLLM, ModelResponse
    from tau2.data_model.message import SystemMessage, UserMessage
    from tau2.environment.tool import Tool

    class Warm(CustomLLM):
        def completion(self, model, messages, *args, **kwargs):
            call = {"id": "warm", "type": "function", "function": {"name": "warm", "arguments": '{"value": "x"}'}}
            return ModelResponse(
                model=model,
                usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                choices=[
                    {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [call]}}
                ],
            )

    def warm(value: str) -> str:
        """Warm the completion path.

        Args:
            value: any text.
        """
        return value

    entry = {"provider": "evolver-warm", "custom_handler": Warm()}
    executor = litellm.utils.executor  # restored as it was: the workers forked later use it
    litellm.custom_provider_map.append(entry)
    litellm.utils.executor = _Inline()
    try:
        llm_utils.generate(
            model="evolver-warm/warm",
            tools=[Tool(warm)],
            messages=[SystemMessage(role="system", content="warm"), UserMessage(role="user", content="warm")],
        )
    finally:
        litellm.custom_provider_map.remove(entry)
        litellm.utils.executor = executor
