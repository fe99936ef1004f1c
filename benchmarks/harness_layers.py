"""Mock-domain reward with each harness layer off and on.

    python benchmarks/harness_layers.py                    # the scripted agents (offline, ~3 min on 2 cores)
    python benchmarks/harness_layers.py --agent-model openai/local --api-base http://127.0.0.1:8080/v1

Each configuration is a fresh `evolver init` repository whose agent/harness.toml
turns on one layer (or none, or all), evaluated with `evolver eval` on tau2's
mock domain (9 tasks). The user simulator and the judge are scripted unless
--user-model/--judge-model say otherwise, so a real agent model meets the same
deterministic customer. Scripted agents (tests/scripts/harness_agents.py):
agent = competent, sloppy = malformed first calls, stubborn = repeats a failing call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["h2_action_realization", "h3_environment_contract", "h4_trajectory_regulation", "h5_procedural_skills"]
CONFIGS = {"off": [], "H2": LAYERS[:1], "H3": LAYERS[1:2], "H4": LAYERS[2:3], "H5": LAYERS[3:], "all": LAYERS}
SCRIPTED_AGENTS = ["scripted/agent", "scripted/sloppy", "scripted/stubborn"]


def evaluate(agent_model: str, layers: list[str], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        subprocess.run([sys.executable, "-m", "evolver", "init", str(repo)], check=True, capture_output=True)
        (repo / "agent" / "harness.toml").write_text("".join(f"{k} = {str(k in layers).lower()}\n" for k in LAYERS))
        cmd = [
            sys.executable,
            "-m",
            "evolver",
            "eval",
            str(repo),
            "--json",
            "--domain",
            "mock",
            "--agent-model",
            agent_model,
            "--user-model",
            args.user_model,
            "--judge-model",
            args.judge_model,
            "--trials",
            str(args.trials),
            "--max-steps",
            str(args.max_steps),
            "--concurrency",
            str(args.concurrency),
        ]
        if args.api_base:
            cmd += ["--agent-api-base", args.api_base]
        env = {
            **os.environ,
            "EVOLVER_SCRIPT": "tests.scripts.harness_agents:script",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"evolver eval failed for {agent_model} with {layers or 'no layers'}:\n{proc.stderr[-2000:]}")
        summary = json.loads(proc.stdout)
        sims = json.loads(Path(summary["result_file"]).read_text())["simulations"]
        return {
            "reward": summary["avg_reward"],
            "steps": sum(s["steps"] for s in sims) / len(sims),
            "agent_tokens": summary["usage"]["agent"]["prompt_tokens"] + summary["usage"]["agent"]["completion_tokens"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent-model", action="append", help="agent model(s) to measure (default: the scripted agents)")
    parser.add_argument("--api-base", help="OpenAI-compatible server of the agent model")
    parser.add_argument("--user-model", default="scripted/user")
    parser.add_argument("--judge-model", default="scripted/judge")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    print(f"{'agent model':<20} {'layers':<6} {'reward':>7} {'steps':>6} {'agent tokens':>13}")
    for model in args.agent_model or SCRIPTED_AGENTS:
        for name, layers in CONFIGS.items():
            r = evaluate(model, layers, args)
            print(f"{model:<20} {name:<6} {r['reward']:>7.3f} {r['steps']:>6.1f} {r['agent_tokens']:>13}", flush=True)


if __name__ == "__main__":
    main()
