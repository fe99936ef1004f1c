"""LLM plumbing shared by the controller (meta-LLM) and the worker (agent, user, judge).

litellm is imported lazily: the controller's start-up stays fast and the
environment is prepared before litellm's import-time side effects run.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from evolver.data import RoleModel, RoleUsage
from evolver.errors import ProviderUnavailable, UsageError


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
RETRY = "retry"  # transient: retried with backoff, then an infrastructure error (the run pauses; resume it later)
CONFIG = "config"  # no retry can fix it: the role's configuration (model, key, options) is wrong, said at once in one line
CANDIDATE = "candidate"  # the agent's own request was refused: handed back to the candidate's code
PROBE = "probe"  # the agent's 400: the candidate's request, unless evolver's own request with the same configuration is refused too
CONTEXT_OVERFLOW, CONTENT_POLICY = "context_overflow", "content_policy"  # what the conversation did to a trusted role
ROLES = ("agent", "user", "judge", "meta")
# Where each role's model and options are set, for the line that says a configuration error.
FIXES = {
    "agent": "--agent-model, --agent-arg or --agent-reasoning-effort",
    "user": "--user-model, --user-arg or --user-reasoning-effort",
    "judge": "--judge-model or --judge-arg",
    "meta": "--meta-model, --meta-arg or --meta-reasoning-effort",
}


def error_table() -> list[tuple[type, dict[str, str]]]:
    """(litellm error class, what it means for each role), the first matching row wins; an answer of 500 or
    more that no row names is transient too. What evolver configures (the model, the key, the options) is
    a configuration error when refused, for every role: a retry sends the same again. The agent builds
    its own messages, so a 400 for it is the candidate's to handle unless the same configuration is
    refused with evolver's own request too (PROBE). The user simulator and the judge run on the trusted
    side: what the conversation causes there (an overflowing context, a content filter) is the
    candidate's doing. The meta-LLM's prompt is evolver's own."""
    import litellm
    import openai

    every = lambda verdict: dict.fromkeys(ROLES, verdict)  # noqa: E731
    refused = {"agent": PROBE, "user": CONFIG, "judge": CONFIG, "meta": CONFIG}
    return [
        (litellm.RateLimitError, every(RETRY)),
        (litellm.Timeout, every(RETRY)),  # not an APIConnectionError in litellm's classes
        (litellm.APIConnectionError, every(RETRY)),
        (litellm.ServiceUnavailableError, every(RETRY)),
        (litellm.InternalServerError, every(RETRY)),
        (litellm.BadGatewayError, every(RETRY)),
        (litellm.AuthenticationError, every(CONFIG)),
        (litellm.PermissionDeniedError, every(CONFIG)),
        (litellm.NotFoundError, every(CONFIG)),
        (litellm.UnsupportedParamsError, every(CONFIG)),  # litellm refused evolver's options before the request left
        (litellm.ContextWindowExceededError, {"agent": CANDIDATE, "user": CONTEXT_OVERFLOW, "judge": CONTEXT_OVERFLOW, "meta": CONFIG}),
        (litellm.ContentPolicyViolationError, {"agent": CANDIDATE, "user": CONTENT_POLICY, "judge": CONTENT_POLICY, "meta": CONFIG}),
        (litellm.BadRequestError, refused),  # any other 400: an option the model does not take, a wrong model argument, a proxy's refusal
        (openai.APIError, refused),  # any other answer of the provider (422, an unmapped status): litellm's classes derive from it
    ]


def verdict(role: str, exc: BaseException) -> str | None:
    """What ``exc``, raised by a completion for ``role``, means (error_table); None for an error that is
    no provider's (a bug, an interrupt): it is raised as it is."""
    import openai

    if any(isinstance(e, ConfigurationError) for e in _chain(exc)):  # litellm wraps a provider's own errors
        return CONFIG
    for cls, by_role in error_table():
        if isinstance(exc, cls):
            unnamed_server_error = cls is openai.APIError and (_status(exc) or 0) >= 500
            return RETRY if unnamed_server_error else by_role[role]
    return None


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def configuration_line(role: str, model: str, exc: BaseException) -> str:
    """One line for a role's configuration error: the role, the model, what the provider said, the fix."""
    own = next((e for e in _chain(exc) if isinstance(e, ConfigurationError)), None)
    if own is not None:
        return str(own)
    fix = {
        401: f"the provider's API key in the environment, or {FIXES[role]}",
        403: f"the key's access to the model, or {FIXES[role]}",
        404: f"--{role}-model (the provider has no such model)",
    }.get(_status(exc), FIXES[role])
    if role == "meta" and "ContextWindow" in type(exc).__name__:
        fix = "--meta-model, or lower meta_context_tokens to the model's context"
    return f"{role} model {model} refused the request ({failure_words(exc)}); fix {fix}"


def failure_words(exc: BaseException) -> str:
    """A provider's error in a few words: its class, its HTTP status, what the provider said."""
    exc = exc.__cause__ if isinstance(exc, ProviderError) and exc.__cause__ is not None else exc
    status = _status(exc)
    return f"{type(exc).__name__}{f', {status}' if status else ''}: {_reason(exc)}"


def _reason(exc: BaseException, limit: int = 300) -> str:
    """The provider's own words, without litellm's class prefixes or the JSON around them."""
    text = str(getattr(exc, "message", None) or exc)
    found = re.search(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    if found:
        text = found.group(1)
    text = re.sub(r"^(litellm\.\w+:\s*)+", "", text)
    text = re.sub(r"^\w+Exception\s*-\s*", "", text).strip()
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    """Wrap a litellm completion function for one role: every request is shaped to what its model takes
    (evolver.models) and carries back the thinking blocks of its tool-using turns; every attempt waits
    for its turn in the rate limit of its provider and model (evolver.ratelimit); transient provider
    errors are backed off and retried (429s with attempts of their own, LIMITED_ATTEMPTS); then it raises
    what error_table says: ConfigurationError (at once: the role's settings are wrong), ProviderError (an
    infrastructure error), ConversationError (the simulation fails, named), or the provider's own error
    for the candidate to handle."""
    import litellm
    from tenacity import Retrying, retry_if_exception, wait_exponential_jitter

    from evolver import models, ratelimit

    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    first_wait = float(os.environ.get("EVOLVER_RETRY_WAIT", "1.0"))
    backoff = wait_exponential_jitter(multiplier=first_wait, max=30, jitter=first_wait)
    memory = models.ThinkingMemory()  # this role's tool-using turns in this process, by their calls' ids

    def call(*args, **kwargs):
        kwargs.pop("num_retries", None)  # retries happen here, with backoff, not inside litellm
        kwargs = models.shape(kwargs).kwargs  # what is left out was said once, by the command's preflight
        if kwargs.get("messages"):
            kwargs["messages"] = memory.restore(kwargs["messages"])
        if (
            kwargs.get("api_base")
            and str(kwargs.get("model", "")).startswith("openai/")
            and not (kwargs.get("api_key") or os.environ.get("OPENAI_API_KEY"))
        ):
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
                    response = _attempt(fn, args, kwargs)
                    memory.remember(response)
                    return response
        except Exception as exc:
            meaning = verdict(role, exc)
            if meaning == PROBE:
                meaning = CONFIG if _configuration_refused(fn, kwargs) else CANDIDATE
            if isinstance(exc, ProviderError) or meaning in (None, CANDIDATE):
                raise
            if meaning in (CONTEXT_OVERFLOW, CONTENT_POLICY):
                raise ConversationError(
                    f"the {role}'s provider refused the conversation: {type(exc).__name__}: {exc}", role, meaning
                ) from exc
            if meaning == CONFIG:
                raise ConfigurationError(configuration_line(role, str(kwargs.get("model", "")), exc), role) from exc
            raise ProviderError(f"{role}: {type(exc).__name__} after {sum(failed.values())} attempt(s): {exc}", role) from exc

    return call


def _attempt(fn: Callable, args: tuple, kwargs: dict):
    """One call, in its turn of the rate limit of its provider and model."""
    import litellm

    from evolver import ratelimit

    turn = ratelimit.permit(str(kwargs.get("model", "")), kwargs.get("api_base"), kwargs)
    try:
        response = fn(*args, **kwargs)
    except Exception as exc:
        turn.failed(exc, limited=isinstance(exc, litellm.RateLimitError))
        raise
    turn.answered(response)
    return response


_probed: dict[tuple[Callable, str], bool] = {}  # a configuration of the agent's model -> whether evolver's own request with it was refused
_probing = threading.Lock()


def _configuration_refused(fn: Callable, kwargs: dict) -> bool:
    """Whether a 400 on the agent's request is its configuration's (evolver's) rather than its messages'
    (the candidate's): the same model, endpoint and options with evolver's own short request, asked once
    per configuration and process. Refused too: the configuration. Answered, or failing otherwise: the
    candidate's request."""
    from evolver import models

    options = {k: v for k, v in kwargs.items() if k not in ("messages", "tools", "tool_choice", "max_retries")}
    key = (fn, json.dumps(options, sort_keys=True, default=str))  # the function itself: an id() may be reused once it is gone
    with _probing:
        if key in _probed:
            return _probed[key]
        probe = {**options, "messages": models.preflight_messages(), **({"tools": [models.PREFLIGHT_TOOL]} if kwargs.get("tools") else {})}
        try:
            _attempt(fn, (), probe)
            refused = False
        except Exception as exc:  # noqa: BLE001 - judged as a request of evolver's own, like the meta-LLM's
            refused = verdict("meta", exc) == CONFIG
        _probed[key] = refused
        return refused


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
                prompt, completion = (
                    c / 1_000_000 for c in litellm.cost_per_token(model=name, prompt_tokens=1_000_000, completion_tokens=1_000_000)
                )
            except Exception:  # litellm raises for a model it has no entry for
                continue
        if prompt or completion:
            return prompt, completion
    return None


def cached_prompt_price(model: str, api_base: str | None, share: float) -> float | None:
    """Dollars per prompt token of a conversation that only grows when ``share`` of it is read from the provider's
    prompt cache and, where the provider caches only up to marked blocks (Anthropic), the rest written to it, at
    litellm's cache prices; None for a model with no known price."""
    import litellm

    from evolver.models import needs_cache_marks

    if price_of(model) is None:
        return None
    million = 1_000_000
    read = round(million * share)
    written = million - read if needs_cache_marks(model, api_base) else 0
    for name in (model, model.split("/", 1)[-1]):  # a custom provider's model is priced by its bare name
        try:
            prompt, _ = litellm.cost_per_token(
                model=name, prompt_tokens=million, cache_read_input_tokens=read, cache_creation_input_tokens=written
            )
        except Exception:  # noqa: BLE001 - litellm raises for a model it has no entry for
            continue
        return prompt / million
    return None


def usage_of(response, model: str) -> RoleUsage:
    """What one completion used, as its provider counts it: prompt tokens (of them, those read from and
    written to the provider's prompt cache, as litellm reports them), completion tokens, and dollars at
    litellm's list prices, cache reads and writes at their own (litellm.completion_cost prices them);
    a custom provider's model at its bare name's price, a model with no price at none (unknown)."""
    import litellm

    tokens = token_counts(response)
    try:
        cost = float(litellm.completion_cost(completion_response=response) or 0.0)
    except Exception:  # noqa: BLE001 - litellm has no entry under the response's model name (a custom provider's)
        cost = 0.0
    if not cost and (price := price_of(model)):
        cost = tokens["prompt_tokens"] * price[0] + tokens["completion_tokens"] * price[1]
    return RoleUsage(**tokens, cost=cost)


TOKEN_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "cache_write_tokens", "cache_reported_tokens")  # RoleUsage's counts


def token_counts(response) -> dict[str, int]:
    """A completion's tokens as RoleUsage counts them (the worker hands tau2 this for its messages' usage)."""
    usage = getattr(response, "usage", None)
    details = getattr(usage, "prompt_tokens_details", None)
    read = (getattr(usage, "cache_read_input_tokens", None), getattr(details, "cached_tokens", None))
    prompt = getattr(usage, "prompt_tokens", 0)
    counts = (
        prompt,
        getattr(usage, "completion_tokens", 0),
        read[0] or read[1],
        getattr(usage, "cache_creation_input_tokens", None) or getattr(details, "cache_creation_tokens", None),
        prompt if any(n is not None for n in read) else 0,
    )  # the provider said how much it read, none included
    return {name: int(count or 0) for name, count in zip(TOKEN_FIELDS, counts)}


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


def missing_key_line(name: str, role: RoleModel) -> str | None:
    """The line that says a role's provider needs a key the environment lacks, or None."""
    missing = missing_api_key(role)
    if not missing:
        return None
    return (
        f"the {name} model '{role.model}' needs {missing} in the environment; set it, or choose another model with --{name}-model "
        "(any OpenAI-compatible server works with --api-base)"
    )


def check_api_base(url: str, roles: list[str], flag: str) -> None:
    """Fail fast, in one line naming ``roles`` and the ``flag`` that set ``url``, when their server is not there. An
    address that is no URL is bad input (exit 2); one nothing answers at is a provider that did not answer the
    command's first request (exit 3, as the preflight says of a hosted one): nothing was spent, and it can be
    started and the command run again."""
    whose = f"the {' and '.join(roles)} " + ("models'" if len(roles) > 1 else "model's")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{whose} API base {url!r} is not an http(s) URL; fix {flag}")
    try:
        urllib.request.urlopen(url.rstrip("/") + "/models", timeout=5)
    except urllib.error.HTTPError:
        return  # it answered: reachable (it may want a key for /models)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ProviderUnavailable(
            f"{whose} API base {url} does not answer ({reason}); nothing was spent: start its server and try again, or fix {flag}"
        ) from None
