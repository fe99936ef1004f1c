"""What one investigating proposal costs on the meta side at list prices, with and without prompt caching.

    python benchmarks/prompt_cost.py [--turns 16] [--fault lost_instruction]

One proposal session (evolver.evolution.proposers.agent.Session, as `evolver run` makes it) on a planted fault of
tests/scripts/planted.py, with a scripted meta-agent that investigates as a capable model does before it edits: it
lists the failures, reads failing trajectories page by page, the agent's files in parts and the guide, searches the
code and the trajectories, looks at earlier candidates, then edits, tries (off: tries cost simulations, not meta
tokens) and submits, in --turns turns. The same session runs once per model against the provider-faithful local
servers of the tests (tests/scripts/fake_openai.py, fake_anthropic.py, fake_gemini.py), which count tokens as four
characters each and apply each provider's published caching rule to the requests evolver sends:

- gpt-5 (OpenAI): the longest prefix of 1,024 tokens or more, in 128-token steps, that the same key sent the model
  recently is read from the cache, by itself;
- claude-sonnet-4-5 (Anthropic): only prefixes that end at a block marked cache_control are written (at 1.25x the
  input price) and read (0.1x); evolver marks the system prompt and the two latest turns (evolver.models.cache_marked);
- gemini-2.5-pro (Google): implicit caching of a repeated prefix of 2,048 tokens or more, by itself.

Each response is priced as evolver prices it (evolver.llm.usage_of: litellm's price map, cache reads and writes at
their own prices); without caching, every prompt token is priced at the input price (what Claude costs when nothing
is marked: Anthropic then caches nothing). Prints a markdown table: turns, prompt and completion tokens, the share
read from the cache, dollars without and with caching, and how many times cheaper caching makes the proposal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.scripts.meta_agent import investigate  # noqa: E402
from tests.scripts.planted import FAULTS, fixes  # noqa: E402
from tests.scripts.planted import script as planted_script  # noqa: E402

MODELS = ("openai/gpt-5", "anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-pro")
KEYS = {"OPENAI_API_KEY": "sk-bench-not-a-key", "ANTHROPIC_API_KEY": "sk-ant-bench-not-a-key", "GEMINI_API_KEY": "bench-not-a-key"}
# What the scripted meta-agent reads before it edits, in order (the last read is the file it then edits).
READS = [
    ("list_failures", {}),
    ("read_trajectory", {"task": "T1"}),
    ("read_trajectory", {"task": "T1", "page": 2}),
    ("list_files", {}),
    ("read_file", {"path": "Harness.md", "start": 1, "end": 80}),
    ("search_code", {"pattern": "def generate_next_message"}),
    ("read_trajectory", {"task": "T2"}),
    ("list_candidates", {}),
    ("search_trajectories", {"pattern": "ended by"}),
    ("read_file", {"path": "agent/agent.py", "start": 1, "end": 120}),
    ("read_file", {"path": "agent/agent.py", "start": 120, "end": 240}),
    ("read_file", {"path": "agent/agent.py", "start": 240, "end": 360}),
    ("read_file", {"path": "agent/agent.py", "start": 360, "end": 480}),
]


def script(name, messages, tools):
    """The planted-fault script, with a meta-agent that reads READS (as many as the turns leave room for) before
    the planted-fault meta-agent (tests/scripts/meta_agent.py) edits, tries and submits."""
    if name != "meta" or not tools:
        return planted_script(name, messages, tools)
    from evolver.scripted import Reply

    reads = int(os.environ.get("BENCH_READS", len(READS)))
    done = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    if done < reads:
        tool, args = READS[done] if done < reads - 1 else ("read_file", {"path": "agent/agent.py"})
        return Reply(tool_calls=[(tool, args)])
    return investigate(messages, fixes())


def analysis(repo: Path) -> Path:
    from benchmarks.planted_faults import SCRIPTED, evolver

    proc = evolver("eval", str(repo), "--json", "--domain", "evolver_gen", "--split", "train", *SCRIPTED, "--concurrency", "8")
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    return Path(json.loads(proc.stdout)["result_file"])


def propose(repo: Path, result_file: Path, meta: str, api_base: str, turns: int, workdir: Path):
    from evolver.data import EvalResult, RoleModel
    from evolver.evolution.evidence import Evidence
    from evolver.evolution.proposers import Budget, Request
    from evolver.evolution.proposers.agent import Session

    analysis = EvalResult.model_validate_json(result_file.read_text())
    request = Request(
        label="1",
        focus=(0, 1),
        parent=repo,
        evidence=Evidence(analysis, result_file.parent),
        learnings=[],
        guide=(ROOT / "Harness.md").read_text(),
        identifiers=frozenset(),
        meta=RoleModel(model=meta, api_base=api_base),
        llm_retries=1,
        context_tokens=200_000,
        budget=Budget(turns=turns, tokens=10**7, tries=0, seconds=3600),
        workdir=workdir,
        prompts_dir=ROOT / "prompts",
    )
    return Session(request).run()


def uncached_cost(meta: str, usage) -> float:
    """Every prompt token at the input price, the completion at the output price (litellm's list prices)."""
    import litellm

    entry = litellm.model_cost[meta.split("/", 1)[1]]
    return usage.prompt_tokens * entry["input_cost_per_token"] + usage.completion_tokens * entry["output_cost_per_token"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", default="lost_instruction", choices=[f.name for f in FAULTS])
    parser.add_argument("--turns", type=int, default=16)
    args = parser.parse_args()
    os.environ.update(
        {
            "EVOLVER_SCRIPT": "benchmarks.prompt_cost:script",
            "BENCH_READS": str(max(1, args.turns - 3)),
            **KEYS,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    from benchmarks.planted_faults import make_repo
    from evolver.llm import prepare_environment
    from tests.scripts.fake_anthropic import FakeAnthropic
    from tests.scripts.fake_gemini import FakeGemini
    from tests.scripts.fake_openai import FakeOpenAI

    prepare_environment()
    roles = {m.split("/", 1)[1]: "meta" for m in MODELS}
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="evolver-cost-") as tmp,
        FakeOpenAI(roles=roles) as openai,
        FakeAnthropic(roles=roles) as anthropic,
        FakeGemini(roles=roles) as gemini,
    ):
        repo = make_repo(Path(tmp) / "repo", next(f for f in FAULTS if f.name == args.fault))
        result_file = analysis(repo)
        for meta, server in zip(MODELS, (openai, anthropic, gemini)):
            outcome = propose(repo, result_file, meta, server.api_base, args.turns, Path(tmp) / meta.replace("/", "-"))
            u, plain = outcome.usage, uncached_cost(meta, outcome.usage)
            rows.append(
                (
                    meta,
                    outcome.stats["turns"],
                    u.prompt_tokens,
                    u.completion_tokens,
                    u.cached_tokens / max(1, u.prompt_tokens),
                    plain,
                    u.cost,
                    outcome.proposal is not None,
                )
            )
    print(f"one proposal on the planted fault {args.fault}, {args.turns} turns, at litellm's list prices (meta side only)\n")
    print("| meta model | turns | prompt tokens | completion tokens | read from the cache | without caching | with caching | cheaper |")
    print("|---|---|---|---|---|---|---|---|")
    for meta, turns, prompt, completion, share, plain, cached, submitted in rows:
        print(
            f"| {meta} | {turns}{'' if submitted else ' (no submission)'} | {prompt:,} | {completion:,} | {share:.0%} | ${plain:.4f} | ${cached:.4f} "
            f"| {plain / cached:.1f}x |"
        )


if __name__ == "__main__":
    main()
