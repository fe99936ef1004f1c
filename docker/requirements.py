"""Print the requirements of evolver and the given extras from pyproject.toml, one a line, for pip.

    python3 docker/requirements.py pyproject.toml local

The image installs them in a layer of their own, before the source is copied: a rebuild after a
source change then reuses that layer instead of fetching every package and the model again. The
build system's own requirement (setuptools) comes too, so the source installs with no network.
"""

import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise ValueError(f"unknown extra {', '.join(unknown)}; pyproject.toml offers: {', '.join(optional)}")
    wanted = [*pyproject["build-system"]["requires"], *project["dependencies"], *(r for e in extras for r in optional[e])]
    own = project["name"]
    # An extra may name evolver's own other extras ("evolver[ray]"): those are expanded, not installed.
    expanded = []
    for req in wanted:
        if req.startswith(own + "["):
            expanded += requirements(pyproject, req[len(own) + 1 : req.index("]")].split(","))
        else:
            expanded.append(req)
    return list(dict.fromkeys(expanded))


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print("usage: requirements.py PYPROJECT [EXTRA[,EXTRA...]]", file=sys.stderr)
        return 2
    extras = [e for e in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if e]
    try:
        with open(sys.argv[1], "rb") as fh:
            print("\n".join(requirements(tomllib.load(fh), extras)))
    except (OSError, tomllib.TOMLDecodeError, ValueError) as exc:
        print(f"requirements.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
