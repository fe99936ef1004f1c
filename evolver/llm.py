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
    """An LLM call failed after retries for reasons outside the candidate (an infrastructure error)."""


def prepare_environment() -> None:
    """Set what litellm reads at import time. Must run before the first `import litellm`."""
    # Without this, every import of litellm fetches a price list from the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_LOG", "ERROR")
    os.environ.setdefault("LOGURU_LEVEL", "ERROR")  # tau2 logs its registry and cache set-up at import: quiet in every command


def _error_classes():
    import litellm

    transient = (
        litellm.RateLimitError,
        litellm.APIConnectionError,  # includes timeouts
        litellm.ServiceUnavailableError,
        litellm.InternalServerError,
        litellm.BadGatewayError,
    )
    # Not the candidate's doing, and retrying will not help.
    fatal = (litellm.AuthenticationError, litellm.PermissionDeniedError, litellm.NotFoundError)
    return transient, fatal


def retrying(fn: Callable, attempts: int) -> Callable:
    """Wrap a litellm completion function: back off and retry transient provider errors,
    then raise ProviderError so the caller can count the simulation as an infrastructure error."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

    transient, fatal = _error_classes()
    first_wait = float(os.environ.get("EVOLVER_RETRY_WAIT", "1.0"))

    def call(*args, **kwargs):
        kwargs.pop("num_retries", None)  # retries happen here, with backoff, not inside litellm
        try:
            for attempt in Retrying(
                retry=retry_if_exception_type(transient),
                stop=stop_after_attempt(max(1, attempts)),
                wait=wait_exponential_jitter(multiplier=first_wait, max=30, jitter=first_wait),
                reraise=True,
            ):
                with attempt:
                    return fn(*args, **kwargs)
        except transient + fatal as exc:
            raise ProviderError(f"{type(exc).__name__} after {attempts} attempt(s): {exc}") from exc

    return call


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
