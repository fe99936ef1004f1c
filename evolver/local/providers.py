"""The custom litellm providers evolver brings, registered in a process before its first completion:
`local/...` (the embedded model's serving path, evolver.local.serving) and `scripted/...` (the
test provider, evolver.scripted).

Here, not in evolver.llm, because the shared layer does not import the embedded model: the
worker (evaluation side) and the proposer (evolution side) call this from above both.
"""

from __future__ import annotations

from evolver.llm import prepare_environment


def register_providers(models) -> None:
    """Register the custom litellm providers that these model strings need."""
    prepare_environment()
    models = list(models)
    if any(m.startswith("scripted/") for m in models):
        from evolver import scripted

        scripted.register()
    if any(m.startswith("local/") for m in models):
        from evolver.local import serving

        serving.register()
