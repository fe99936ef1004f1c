"""Does llama.cpp's prompt cache carry the investigating proposer's conversation from turn to turn?

    python benchmarks/prompt_cache.py [--fault argument_coercion] [--turns 8] [--size default]

One proposal session (evolver.evolution.proposers.agent) with the embedded model as the meta-LLM, on a
planted fault of tests/scripts/planted.py (its analysis evaluation made first, with the scripted agent
and customer). The server's own log says, for every request, how many prompt tokens it evaluated; the
rest of the prompt came from the slot's cache. Prints, per turn, the prompt's length, the tokens
evaluated, the share reused and the seconds, and the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.scripts.planted import FAULTS  # noqa: E402

EVALUATED = re.compile(r"task (\d+) \| prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens")
RELEASED = re.compile(r"task (\d+) \| stop processing: n_tokens = (\d+)")
GENERATED = re.compile(r"task (\d+) \|\s+eval time =\s+([\d.]+) ms /\s+(\d+) tokens")


def requests(log: str) -> list[dict]:
    """Per request of the server: prompt tokens evaluated, tokens in the slot at the end, tokens generated."""
    out: dict[str, dict] = {}
    for pattern, keys in ((EVALUATED, ("prompt_ms", "evaluated")), (GENERATED, ("eval_ms", "generated")), (RELEASED, ("n_tokens",))):
        for match in pattern.finditer(log):
            entry = out.setdefault(match.group(1), {})
            for key, value in zip(keys, match.groups()[1:]):
                entry[key] = float(value)
    rows = [r for r in out.values() if {"evaluated", "generated", "n_tokens"} <= r.keys()]
    for r in rows:
        r["prompt"] = r["n_tokens"] - r["generated"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", default="argument_coercion", choices=[f.name for f in FAULTS])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--size", default="default", choices=("default", "small"))
    args = parser.parse_args()
    os.environ.setdefault("EVOLVER_SCRIPT", "tests.scripts.planted:script")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

    from benchmarks.planted_faults import SCRIPTED, evolver, make_repo
    from evolver.data import EvalResult, RoleModel
    from evolver.evolution.evidence import Evidence
    from evolver.evolution.proposers import Budget, Request
    from evolver.evolution.proposers.agent import Session
    from evolver.local.provision import resolve_model
    from evolver.local.server import LocalServer

    fault = next(f for f in FAULTS if f.name == args.fault)
    with tempfile.TemporaryDirectory(prefix="evolver-cache-") as tmp:
        repo = make_repo(Path(tmp) / "repo", fault)
        proc = evolver("eval", str(repo), "--json", "--domain", "evolver_gen", "--split", "train", *SCRIPTED, "--concurrency", "8")
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        result_file = Path(json.loads(proc.stdout)["result_file"])
        analysis = EvalResult.model_validate_json(result_file.read_text())
        log = Path(tmp) / "server.log"
        with LocalServer(resolve_model(args.size), log_path=log) as server:
            request = Request(
                label="1",
                focus=(0, 1),
                parent=repo,
                evidence=Evidence(analysis, result_file.parent),
                learnings=[],
                guide=(ROOT / "Harness.md").read_text(),
                identifiers=frozenset(),
                meta=RoleModel(model="local/meta", api_base=server.api_base),
                llm_retries=2,
                context_tokens=12288,
                budget=Budget(turns=args.turns, tokens=10**7, tries=0, seconds=3600),
                workdir=Path(tmp) / "proposal",
                prompts_dir=ROOT / "prompts",
            )
            started = time.monotonic()
            outcome = Session(request).run()
            seconds = time.monotonic() - started
        rows = requests(log.read_text())
    print(
        f"{args.size} model, fault {fault.name}, {outcome.stats['turns']} turn(s) in {seconds:.0f} s; stopped: {outcome.stats['stopped']}"
    )
    print("| request | prompt tokens | evaluated | reused | prompt s | answer tokens | answer s |")
    print("|---|---|---|---|---|---|---|")
    for n, r in enumerate(rows, 1):
        print(
            f"| {n} | {r['prompt']:.0f} | {r['evaluated']:.0f} | {1 - r['evaluated'] / max(1, r['prompt']):.0%} | {r['prompt_ms'] / 1000:.1f} "
            f"| {r['generated']:.0f} | {r['eval_ms'] / 1000:.1f} |"
        )
    prompt, evaluated = sum(r["prompt"] for r in rows), sum(r["evaluated"] for r in rows)
    later = rows[1:]
    print(
        f"\nall requests: {prompt:.0f} prompt tokens, {evaluated:.0f} evaluated, {1 - evaluated / max(1, prompt):.0%} reused from the cache; "
        f"after the first: {1 - sum(r['evaluated'] for r in later) / max(1, sum(r['prompt'] for r in later)):.0%} reused"
    )


if __name__ == "__main__":
    main()
