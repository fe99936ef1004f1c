"""`evolver init`: a repository set up from the template, or brought from auto-harness or Life-Harness (--from)."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_init(args: argparse.Namespace) -> int:
    from evolver.cli.scaffold import init_repo

    migration = None
    if args.source is not None:
        from evolver.cli.migrate import read_source

        migration = read_source(args.source)  # bad input fails here, before anything is written
    written = init_repo(Path(args.dir), force=args.force, migration=migration)
    print(f"initialised {Path(args.dir).resolve()}" + (f" from {migration.source}" if migration else "") + ": " + ", ".join(written))
    if migration:
        print("mapped:")
        print("\n".join(f"  {line}" for line in migration.mapped))
        print("left out (no equivalent in evolver, or not needed):")
        print("\n".join(f"  {line}" for line in migration.left_out) or "  nothing")
    print(
        "next: commit these files (git add -A && git commit), then `evolver eval`; with no OPENAI_API_KEY and no "
        "--agent-model it runs on the embedded local model"
    )
    return 0
