"""Run by tests/test_confine.py in a fresh interpreter: confine this process with
evolver's sandbox, then try to read what it must not, and print what happened as JSON.

    python -m tests.scripts.confine_probe MODE SCRATCH [HIDE]

MODE: "mount" (the data hidden under a tmpfs, where the kernel allows it),
"landlock" (as if the mount were refused: the grants leave the data out) or
"threaded" (confined while another thread runs, so the kernel refuses new
namespaces, as where unprivileged user namespaces are off). Except when
threaded, a forked child confines itself, as the zygote's agent processes do.
HIDE: a folder to hide besides tau2's data (say, one inside the standard library).
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import tau2

from evolver.evaluation import sandbox


def attempt(fn) -> str:
    try:
        return f"ok: {fn()!r}"[:80]
    except OSError as exc:
        return type(exc).__name__


def main() -> None:
    mode, scratch = sys.argv[1], Path(sys.argv[2])
    extra = [Path(sys.argv[3]).resolve()] if len(sys.argv) > 3 else []
    hidden = (*sandbox.hidden_paths(), *extra)
    sandbox.hidden_paths = lambda: hidden
    if mode == "landlock":  # as where the kernel refuses mounts: neither tmpfs
        sandbox._mount_over = lambda libc, paths: False
        sandbox._mount_scratch = lambda libc, scratch, size_mb: False
    if mode == "threaded":
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    elif os.fork():
        _, status = os.wait()
        sys.exit(os.waitstatus_to_exitcode(status))
    isolation = sandbox.confine([], scratch, sandbox.Limits(scratch_mb=4))
    data = Path(tau2.__file__).parent / "data"
    probes = {
        "tau2 data listing": lambda: os.listdir(data),
        "tau2 tasks.json": lambda: len((data / "tau2/domains/mock/tasks.json").read_bytes()),
        "tau2 module": lambda: len((Path(tau2.__file__).parent / "agent/llm_agent.py").read_bytes()),
        "stdlib os.py": lambda: len(Path(os.__file__).read_bytes()),
        "scratch write": lambda: (scratch / "note").write_text("x"),
        "scratch 6 MiB in all": lambda: [(scratch / f"fill-{i}").write_bytes(bytes(2 << 20)) for i in range(3)] and "written",
        "home listing": lambda: os.listdir(Path.home()),
        "etc passwd": lambda: len(Path("/etc/passwd").read_bytes()),
    }
    for folder in extra:
        probes["hidden listing"] = lambda: os.listdir(folder)
        probes["hidden file"] = lambda: len((folder / "__init__.py").read_bytes())
    print(json.dumps({"isolation": isolation, "probes": {k: attempt(f) for k, f in probes.items()}}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
