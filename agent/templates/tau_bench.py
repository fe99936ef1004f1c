"""The tau2-bench agent that evolver optimizes (pristine baseline).

`agent/agent.py` starts as a copy of this file; evolution edits that copy,
never this one. Three surfaces are meant to change:

- AGENT_INSTRUCTION: the instruction text placed above the domain policy.
- HarnessState: what the agent remembers during one conversation.
- HarnessAgent.generate_next_message: one turn of the agent.

The model name and LLM arguments are not set here: tau2 passes them in
(`llm`, `llm_args`) from evolver's configuration at run time.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field
from tau2.agent.base import ValidAgentInputMessage, is_valid_agent_history_message
from tau2.agent.llm_agent import LLMAgent
from tau2.data_model.message import (
    APICompatibleMessage,
    AssistantMessage,
    Message,
    MultiToolMessage,
    SystemMessage,
)
from tau2.utils.llm_utils import generate

AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy.
""".strip()

SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()


class HarnessState(BaseModel):
    """Per-conversation state: the prompt and the messages seen so far."""

    system_messages: list[SystemMessage]
    messages: list[APICompatibleMessage] = Field(default_factory=list)


class HarnessAgent(LLMAgent):
    """A tau2 local agent; tau2 builds one per simulation."""

    @property
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(
            agent_instruction=AGENT_INSTRUCTION, domain_policy=self.domain_policy
        )

    def get_init_state(
        self, message_history: Optional[list[Message]] = None
    ) -> HarnessState:
        history = list(message_history or [])
        if not all(is_valid_agent_history_message(m) for m in history):
            raise ValueError("message history may hold only user, assistant and tool messages")
        return HarnessState(
            system_messages=[SystemMessage(role="system", content=self.system_prompt)],
            messages=history,
        )

    def generate_next_message(
        self, message: ValidAgentInputMessage, state: HarnessState
    ) -> tuple[AssistantMessage, HarnessState]:
        if isinstance(message, MultiToolMessage):
            state.messages.extend(message.tool_messages)
        else:
            state.messages.append(message)
        reply = generate(
            model=self.llm,
            tools=self.tools,
            messages=state.system_messages + state.messages,
            **self.llm_args,
        )
        state.messages.append(reply)
        return reply, state
