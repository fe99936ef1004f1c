"""LLM plumbing shared by the controller (meta-LLM) and the worker (agent, user, judge).

litellm is imported lazily: the controller's start-up stays fast and the
environment is prepared before litellm's import-time side effects run.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from typing import Callable

from evolver.data import RoleModel
from evolver.errors import UsageError


class ProviderError(RuntimeError):
    """An LLM call failed for reasons outside the candidate (an infrastructure error), after retries
    where they could help. ``role`` names the side that failed: agent, user, judge or meta."""

    def __init__(self, message: str, role: str = ""):
        super().__init__(message)
        self.role = role


class ConfigurationError(ProviderError):
    """A role cannot be called as configured (evolver's own providers raise it, e.g. the embedded
    model without its server's address): never retried, never the candidate's."""


class ConversationError(RuntimeError):
    """What the conversation itself caused on a trusted role (the customer's or the judge's context
    overflowing, a content filter): the candidate's doing, so the simulation fails, with a
    termination reason that names the role and what happened."""

    def __init__(self, message: str, role: str, what: str):
        super().__init__(message)
        self.role, self.what = role, what

    @property
    def termination_reason(self) -> str:
        return f"{self.role}_{self.what}"


def prepare_environment() -> None:
    """Set what litellm reads at import time. Must run before the first `import litellm`."""
    # Without this, every import of litellm fetches a price list from the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_LOG", "ERROR")
    os.environ.setdefault("LOGURU_LEVEL", "ERROR")  # tau2 logs its registry and cache set-up at import: quiet in every command


# What a provider's error means, per role (tests/test_provider_errors.py has a test per row):
RETRY = "retry"  # transient: retried with backoff, then an infrastructure error
INFRA = "infra"  # an infrastructure error at once: the trusted side's configuration or account
CANDIDATE = "candidate"  # the agent's own request was refused: handed back to the candidate's code
CONTEXT_OVERFLOW, CONTENT_POLICY = "context_overflow", "content_policy"  # what the conversation did to a trusted role
ROLES = ("agent", "user", "judge", "meta")


def error_table() -> list[tuple[type, dict[str, str]]]:
    """(litellm error class, what it means for each role), the first matching row wins. The agent
    builds its own requests, so a request its provider refuses is the candidate's to handle. The user
    simulator and the judge run on the trusted side with evolver's configuration: a refusal there is
    the trusted side failing, except an overflowing context or a content filter, which the
    conversation (the candidate's messages) caused. The meta-LLM's prompt is evolver's own."""
    import litellm
    import openai

    every = lambda verdict: dict.fromkeys(ROLES, verdict)  # noqa: E731
    refused = {"agent": CANDIDATE, "user": INFRA, "judge": INFRA, "meta": INFRA}
    return [
        (litellm.RateLimitError, every(RETRY)),
        (litellm.Timeout, every(RETRY)),  # not an APIConnectionError in litellm's classes
        (litellm.APIConnectionError, every(RETRY)),
        (litellm.ServiceUnavailableError, every(RETRY)),
        (litellm.InternalServerError, every(RETRY)),
        (litellm.BadGatewayError, every(RETRY)),
        (litellm.AuthenticationError, every(INFRA)),
        (litellm.PermissionDeniedError, every(INFRA)),
        (litellm.NotFoundError, every(INFRA)),
        (litellm.ContextWindowExceededError, {"agent": CANDIDATE, "user": CONTEXT_OVERFLOW, "judge": CONTEXT_OVERFLOW, "meta": INFRA}),
        (litellm.ContentPolicyViolationError, {"agent": CANDIDATE, "user": CONTENT_POLICY, "judge": CONTENT_POLICY, "meta": INFRA}),
        (litellm.BadRequestError, refused),  # any other 400: an unsupported parameter, a wrong model argument, a proxy's refusal
        (openai.APIError, refused),  # any other answer of the provider (422, an unmapped status): litellm's classes derive from it
    ]


def verdict(role: str, exc: BaseException) -> str | None:
    """What ``exc``, raised by a completion for ``role``, means (error_table); None for an error that is
    no provider's (a bug, an interrupt): it is raised as it is."""
    if any(isinstance(e, ConfigurationError) for e in _chain(exc)):  # litellm wraps a provider's own errors
        return INFRA
    for cls, by_role in error_table():
        if isinstance(exc, cls):
            return by_role[role]
    return None


def _chain(exc: BaseException | None):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


# 429s one call may meet before it counts as an infrastructure error: each waits for its next turn in
# the rate limiter (evolver.ratelimit), which slows the lane, so only a provider that keeps refusing
# (an exhausted quota) gets this far.
LIMITED_ATTEMPTS = 12


def retrying(fn: Callable, attempts: int, role: str) -> Callable:
    """Wrap a litellm completion function for one role: every attempt waits for its turn in the rate
    limit of its provider and model (evolver.ratelimit), transient provider errors are backed off and
    retried (429s with attempts of their own, LIMITED_ATTEMPTS), then it raises what error_table says: ProviderError (an infrastructure error), ConversationError (the
    simulation fails, named), or the provider's own error for the candidate to handle."""
    import litellm
    from tenacity import Retrying, retry_if_exception, wait_exponential_jitter

    from evolver import ratelimit

    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    first_wait = float(os.environ.get("EVOLVER_RETRY_WAIT", "1.0"))
    backoff = wait_exponential_jitter(multiplier=first_wait, max=30, jitter=first_wait)

    def call(*args, **kwargs):
        kwargs.pop("num_retries", None)  # retries happen here, with backoff, not inside litellm
        if kwargs.get("api_base") and str(kwargs.get("model", "")).startswith("openai/") and not (kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY")):
            kwargs["api_key"] = "no-key"  # a vLLM, Ollama or llama.cpp server wants none, but the OpenAI client insists on one
        failed = {"limited": 0, "other": 0}  # a 429 waits in the rate limiter's queue: it has attempts of its own
        paced = not ratelimit.switched_off()
        if paced:  # the OpenAI client's own retries would hide 429s from the rate limiter and send more of them
            kwargs["max_retries"] = 0

        def stop(state) -> bool:
            kind = "limited" if paced and isinstance(state.outcome.exception(), litellm.RateLimitError) else "other"
            failed[kind] += 1
            return failed[kind] >= (LIMITED_ATTEMPTS if kind == "limited" else max(1, attempts))

        def wait(state) -> float:  # the next permit paces a 429's retry (Retry-After, the learnt rate): no backoff of its own
            return 0.0 if paced and isinstance(state.outcome.exception(), litellm.RateLimitError) else backoff(state)

        try:
            for attempt in Retrying(retry=retry_if_exception(lambda exc: verdict(role, exc) == RETRY), stop=stop, wait=wait, reraise=True):
                with attempt:
                    turn = ratelimit.permit(str(kwargs.get("model", "")), kwargs.get("api_base"), kwargs)
                    try:
                        response = fn(*args, **kwargs)
                    except Exception as exc:
                        turn.failed(exc, limited=isinstance(exc, litellm.RateLimitError))
                        raise
                    turn.answered(response)
                    return response
        except Exception as exc:
            meaning = verdict(role, exc)
            if isinstance(exc, ProviderError) or meaning in (None, CANDIDATE):
                raise
            if meaning in (CONTEXT_OVERFLOW, CONTENT_POLICY):
                raise ConversationError(f"the {role}'s provider refused the conversation: {type(exc).__name__}: {exc}", role, meaning) from exc
            tries = f" after {sum(failed.values())} attempt(s)" if meaning == RETRY else ""
            raise ProviderError(f"{role}: {type(exc).__name__}{tries}: {exc}", role) from exc

    return call


def price_of(model: str) -> tuple[float, float] | None:
    """Dollars per prompt token and per completion token of a litellm model, or None when litellm knows
    no price for it (a local or self-hosted model): its cost is then unknown, never $0."""
    import litellm

    litellm.suppress_debug_info = True  # its lookups print a provider list to the terminal
    if model.startswith("local/"):  # the embedded model, or a server of yours: evolver knows no price
        return None
    if model.startswith("scripted/"):
        from evolver.scripted import register_price

        register_price(model.split("/", 1)[1])
    for name in (model, model.split("/", 1)[-1]):  # a custom provider's model is priced by its bare name
        entry = litellm.model_cost.get(name) or {}
        prompt, completion = entry.get("input_cost_per_token") or 0.0, entry.get("output_cost_per_token") or 0.0
        if not (prompt or completion):
            try:
                prompt, completion = (c / 1_000_000 for c in litellm.cost_per_token(model=name, prompt_tokens=1_000_000,
                                                                                     completion_tokens=1_000_000))
            except Exception:  # litellm raises for a model it has no entry for
                continue
        if prompt or completion:
            return prompt, completion
    return None


def missing_api_key(role: RoleModel) -> str | None:
    """Name the environment variable a role's provider needs and lacks, or None."""
    if role.api_base or role.model.startswith(("scripted/", "local/")):
        return None  # a local server or the test provider: no key needed
    import litellm

    try:
        check = litellm.validate_environment(model=role.model)
    except Exception:  # unknown provider: litellm itself will report it at the first call
        return None
    missing = check.get("missing_keys") or []
    return ", ".join(missing) if missing else None


def check_api_base(url: str) -> None:
    """Fail fast, in one line, when an OpenAI-compatible server is not there."""
    try:
        urllib.request.urlopen(url.rstrip("/") + "/models", timeout=5)
    except urllib.error.HTTPError:
        return  # it answered: reachable (it may want a key for /models)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UsageError(f"cannot reach the API base {url} ({reason}); start the server or fix --api-base") from None
