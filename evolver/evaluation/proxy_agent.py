"""The trusted side of the agent: a tau2 agent that runs none of the candidate's code.

tau2's orchestrator, environment, user simulator and evaluator stay in the
trusted worker. ProxyAgent, registered with tau2's registry, forwards each agent
call (initial state, next message, stop check, seed) to a sandboxed agent
process (evolver.evaluation.agent_host), one per simulation, and answers that process's
LLM requests itself: with the configured model, endpoint and sampling settings,
counting tokens and cost here. What comes back is hostile input: it is
validated, and a broken protocol, an exit, a crash, a kill at a limit or a
silence longer than the turn limit ends the simulation as the candidate's
failure (AgentFault). Only a provider error after retries, raised here, is an
infrastructure error.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from tau2.agent.llm_agent import LLMAgent
from tau2.data_model.message import AssistantMessage

from evolver.data import RoleModel, RoleUsage
from evolver.evaluation.agent_host import encode_message
from evolver.evaluation.agent_wire import AgentFault, assistant_message, clipped, llm_request, response_wire
from evolver.evaluation.channel import Channel, ChannelClosed, ChannelError, ChannelTimeout
from evolver.llm import ProviderError, usage_of

MAX_LLM_CALLS_PER_TURN = 16  # H2's retry makes 2; an agent in a loop of requests is stopped


class SandboxFailure(RuntimeError):
    """The agent process could not confine itself: a fault of the trusted side, not the candidate's."""


@dataclass
class Settings:
    """How this worker runs agent processes (set once by evolver.evaluation.worker)."""

    role: RoleModel  # the agent's configured model: the candidate never chooses it
    source: Path  # the read-only copy of the candidate's agent/ (its parent goes on sys.path)
    scratch_root: Path
    sandbox: bool
    limits: dict
    turn_timeout: float  # seconds the agent may compute on one turn, LLM calls not counted
    completion: Callable  # litellm completion with retries (evolver.llm.retrying)
    factory: object  # zygote_client.WorkerConnection
    max_steps: Optional[int] = None  # tau2's step limit, told to the agent (its H4 layer counts down from it)
    names: dict = field(default_factory=dict)  # AGENT_MODEL and AGENT_REASONING_EFFORT for the agent's environment (RoleModel.agent_names)


@dataclass
class SimContext:
    """What the trusted side counts for one simulation."""

    usage: RoleUsage = field(default_factory=RoleUsage)
    provider_error: Optional[str] = None
    processes: list["AgentProcess"] = field(default_factory=list)

    def close(self) -> None:
        for process in self.processes:
            process.close()


settings: Optional[Settings] = None
pool: Optional[AgentPool] = None  # set by the worker once the candidate imports
_local = threading.local()


def begin_simulation() -> SimContext:
    """Called by the worker's recorder in the thread that is about to run one simulation."""
    _local.context = SimContext()
    return _local.context


def _context() -> SimContext:
    context = getattr(_local, "context", None)
    if context is None:  # a tau2 path that bypassed the recorder: count anyway
        context = begin_simulation()
    return context


class AgentProcess:
    """One sandboxed agent process and its channel. Started ahead of its simulation (see
    AgentPool), it confines itself and imports the candidate meanwhile; attach() hands it to
    one simulation, and it serves no other."""

    def __init__(self, s: Settings):
        self.s, self.context = s, None
        self.scratch = Path(tempfile.mkdtemp(prefix="sim-", dir=s.scratch_root))
        ours, theirs = socket.socketpair()
        spec = {"source": str(s.source), "scratch": str(self.scratch), "sandbox": s.sandbox, "limits": s.limits, "names": s.names}
        try:
            self.pid = s.factory.spawn_agent(spec, theirs.fileno())
        finally:
            theirs.close()
        self.chan = Channel(ours)
        self.closed = self.reaped = self.ready = False
        self.isolation: dict = {}  # what the sandbox put in force, once the process says it is confined
        self.turn_usage = RoleUsage()

    def attach(self, context: SimContext) -> "AgentProcess":
        """Give this process to one simulation, once it has confined itself and imported the candidate
        (the worker's import check attaches it first, then hands it on to the first simulation)."""
        self.context = context
        context.processes.append(self)
        if self.ready:
            return self
        # Nothing of the candidate's has run yet: this first answer is still trustworthy.
        first = self._receive(("confined", "sandbox_error"), "setting up its sandbox")
        if first["op"] == "sandbox_error":
            self.close()
            raise SandboxFailure(f"the agent sandbox could not be set up: {first.get('error')}")
        self.isolation = first.get("isolation") or {}
        ready = self._receive(("ready", "import_error"), "importing agent/agent.py")
        if ready["op"] == "import_error":
            raise AgentFault(f"agent/agent.py failed to import: {clipped(ready.get('error'))}")
        self.ready = True
        return self

    def request(self, message: dict, expect: str) -> dict:
        """Send one request and serve the agent's LLM calls until its answer arrives."""
        self.turn_usage, calls = RoleUsage(), 0
        self._send(message)
        while True:
            answer = self._receive((expect, "llm"), "answering")
            if answer["op"] == expect:
                return answer
            calls += 1
            if calls > MAX_LLM_CALLS_PER_TURN:
                raise AgentFault(f"the agent made more than {MAX_LLM_CALLS_PER_TURN} LLM calls in one turn")
            self._answer_llm(answer)

    def _answer_llm(self, request: dict) -> None:
        kwargs = llm_request(request)
        role = self.s.role
        try:
            response = self.s.completion(model=role.model, **kwargs, **role.litellm_args())
        except ProviderError as exc:  # raised by the trusted side alone: an infrastructure error
            self.context.provider_error = str(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - a request the provider refused is the candidate's to handle
            self._send({"op": "llm_error", "error": f"{type(exc).__name__}: {exc}"[:2000]})
            return
        spent = usage_of(response, role.model)
        self.turn_usage = self.turn_usage.add(spent)
        self.context.usage = self.context.usage.add(spent)
        self._send({"op": "llm_reply", "response": response_wire(response)})

    def _send(self, message: dict) -> None:
        try:
            self.chan.send(message)
        except ChannelError as exc:
            raise AgentFault(self._ended(exc)) from None

    def _receive(self, ops: tuple[str, ...], doing: str) -> dict:
        try:
            message = self.chan.receive(self.s.turn_timeout)
        except ChannelTimeout:
            self.close()
            raise AgentFault(
                f"the agent process did not answer within {self.s.turn_timeout:g} s while {doing} (LLM calls not counted)"
            ) from None
        except ChannelClosed as exc:
            raise AgentFault(self._ended(exc)) from None
        except ChannelError as exc:  # it is still running, writing what is not the protocol
            self.close()
            raise AgentFault(f"the agent process broke the protocol ({exc}) while {doing}") from None
        if message["op"] == "error":
            raise AgentFault(f"the agent raised {clipped(message.get('error'))}")
        if message["op"] not in ops:
            raise AgentFault(f"the agent process broke the protocol: '{clipped(message['op'], 40)}' while {doing}")
        return message

    def _ended(self, exc: ChannelError) -> str:
        """Why the channel ended: the agent process's exit code or signal, as the zygote saw it."""
        code = self.s.factory.exit_code(self.pid, 5.0)  # before close(): our own kill is not the cause
        self.reaped = code is not None
        self.close()
        if code is None:
            return f"the agent process stopped answering ({exc})"
        if code >= 0:
            return f"the agent process exited with code {code} in the middle of the simulation"
        sig = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        why = {"SIGXCPU": " (its CPU-time limit)", "SIGXFSZ": " (its file-size limit)", "SIGKILL": " (killed)"}.get(sig, "")
        return f"the agent process ended by {sig}{why}"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.chan.send({"op": "stop"})
        except ChannelError:
            pass
        self.chan.close()
        try:
            if not self.reaped:  # a reaped pid may already belong to someone else
                os.killpg(self.pid, signal.SIGKILL)  # threads it started, or a hang in stop(): gone with it
        except (ProcessLookupError, PermissionError):
            pass
        shutil.rmtree(self.scratch, ignore_errors=True)


class AgentPool:
    """Agent processes started before their simulations need them, so that starting one (fork,
    confinement, importing the candidate: tens of milliseconds of CPU) overlaps the LLM calls
    of the simulations already running instead of delaying the next one. ``want()`` says how
    many may wait at a time; it falls to 0 once every simulation has its process, so none is
    started for nothing. Each process still serves exactly one simulation."""

    def __init__(self, s: Settings, want: Callable[[], int], ready: tuple[AgentProcess, ...] = ()):
        self.s, self.want = s, want
        self.ready: deque[AgentProcess] = deque(ready)
        self.cond = threading.Condition()
        self.closed = False
        self.starting = 0  # 1 while the refill thread starts a process
        self.promised = 0  # takers waiting for that process
        self.failures = 0  # processes that failed to start; each one backs the next try off
        self.thread = threading.Thread(target=self._refill, name="agent-pool", daemon=True)
        self.thread.start()

    def take(self, context: SimContext) -> AgentProcess:
        with self.cond:
            if not self.ready and self.starting > self.promised:  # one on its way, unclaimed: wait for it
                self.promised += 1  # instead of starting a second that the first would leave unused
                while not self.ready and self.starting and not self.closed:
                    self.cond.wait()
                self.promised -= 1
            process = self.ready.popleft() if self.ready else None
            self.cond.notify_all()
        return (process or AgentProcess(self.s)).attach(context)

    def _refill(self) -> None:
        retry_at = 0.0
        while True:
            with self.cond:
                while not self.closed and (time.monotonic() < retry_at or len(self.ready) >= self.want()):
                    self.cond.wait(0.2)  # other workers' claims change want() without telling us
                if self.closed:
                    return
                self.starting = 1
            try:
                process = AgentProcess(self.s)
            except Exception:  # noqa: BLE001 - the simulations' own start will raise it where it is reported
                process = None
                # A passing cause (memory, a busy zygote) must not end prestarting for the whole
                # evaluation: try again later, backing off while it keeps failing.
                self.failures += 1
                retry_at = time.monotonic() + min(30.0, 0.5 * 2**self.failures)
            with self.cond:
                self.starting = 0
                self.cond.notify_all()
                if process is not None and self.closed:
                    process.close()
                    return
                if process is not None:
                    self.ready.append(process)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        while self.ready:
            self.ready.popleft().close()


class ProxyState:
    """What tau2 keeps as the agent's state; the real one lives in the agent process."""


class ProxyAgent(LLMAgent):
    """The agent tau2 runs: every call goes to this simulation's sandboxed agent process."""

    def __init__(self, tools, domain_policy, llm=None, llm_args=None):
        super().__init__(tools=tools, domain_policy=domain_policy, llm=llm, llm_args=llm_args)
        self.seed: Optional[int] = None
        self.process: Optional[AgentProcess] = None
        self.last: tuple[Optional[AssistantMessage], bool] = (None, False)

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def get_init_state(self, message_history=None) -> ProxyState:
        context = _context()
        self.process = pool.take(context) if pool else AgentProcess(settings).attach(context)
        self.process.request(
            {
                "op": "init",
                "tools": [t.openai_schema for t in self.tools],
                "policy": self.domain_policy,
                "history": [encode_message(m) for m in message_history or []] or None,
                "seed": self.seed,
                "max_steps": settings.max_steps,
            },
            "initialised",
        )
        return ProxyState()

    def generate_next_message(self, message, state):
        answer = self.process.request({"op": "next", "message": encode_message(message)}, "reply")
        reply = assistant_message(answer.get("message"), self.process.turn_usage)
        self.last = (reply, answer.get("stop") is True)
        return reply, state

    def is_stop(self, message) -> bool:
        if message is self.last[0]:
            return self.last[1]
        return self.process.request({"op": "is_stop", "message": encode_message(message)}, "is_stop").get("stop") is True

    def stop(self, message=None, state=None) -> None:
        if self.process is not None:
            self.process.close()
