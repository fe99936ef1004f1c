"""The llama.cpp OpenAI-compatible server (through xllamacpp), run as a child process.

    with LocalServer(model_path) as srv:
        srv.api_base   # "http://127.0.0.1:PORT/v1"

Why a subprocess: the model's threads and memory stay out of evolver's
processes, and stopping it is a kill that frees everything. No orphans: the
child leads its own process group (so a terminal's Ctrl-C reaches evolver,
which then stops it in order), it is stopped on exit, on errors and at
interpreter exit, and it also exits by itself when its stdin pipe closes,
which happens however its parent dies (even SIGKILL).

The child is `python -m evolver.local.server CONFIG_JSON`: it loads the
model, prints one JSON line with its address, and serves until stdin closes.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from evolver.errors import UsageError
from evolver.local.provision import check_cpu
from evolver.local.template import fixed_chat_template

ALIAS = "local"
# Two slots: the agent and the user simulator of a simulation alternate, and each
# keeps its own prompt cache in its slot, so a turn only processes the new tokens.
PARALLEL = 2
# llama.cpp divides n_ctx among the slots. Per slot: tau2's mock prompts peak well
# under 4k tokens; airline/retail policies plus tools are about 8-10k, and the meta
# prompt must fit too (see docs/local_model.md for the measured sizes).
CTX_PER_SLOT = 16384
# The reply limit of a request that sets none (llama.cpp's n_predict; a request's own
# max_tokens wins, measured), so a plain `openai/local` client's repetition loop ends
# in minutes, not at the end of the context. evolver.cli.start keeps the meta prompt to
# CTX_PER_SLOT - 4096, so a reply this long still fits the slot.
MAX_TOKENS = 4096


class LocalServer:
    def __init__(
        self,
        model_path: str | Path,
        *,
        port: Optional[int] = None,
        threads: int = 2,
        parallel: int = PARALLEL,
        ctx_per_slot: int = CTX_PER_SLOT,
        max_tokens: int = MAX_TOKENS,
        chat_template: Optional[str] = None,
        fix_template: bool = True,
        log_path: Optional[str | Path] = None,
        startup_timeout: float = 300.0,
    ):
        if chat_template is None and fix_template:
            chat_template = fixed_chat_template(Path(model_path))  # None: the GGUF's own is fine
        self.config = {
            "model": str(model_path),
            "port": port or 0,
            "threads": threads,
            "parallel": parallel,
            "n_ctx": parallel * ctx_per_slot,
            "max_tokens": max_tokens,
            "chat_template": chat_template,
        }
        self.requested_port = port
        self.startup_timeout = startup_timeout
        self._own_log = log_path is None
        self.log_path = Path(log_path) if log_path else None
        self.proc: Optional[subprocess.Popen] = None
        self.address: Optional[str] = None  # "http://127.0.0.1:PORT"

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL (litellm's api_base)."""
        if not self.address:
            raise RuntimeError("the local server is not running")
        return self.address + "/v1"

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(keep_log=exc[0] is not None)

    def start(self) -> "LocalServer":
        check_cpu()
        if self.requested_port:
            _check_port_free(self.requested_port)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="evolver-llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "evolver.local.server", json.dumps(self.config)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        atexit.register(self.stop)
        try:
            self.address = self._wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise
        return self

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + self.startup_timeout
        # The child prints its address only after the model is loaded and the port bound.
        ready, _, _ = select.select([self.proc.stdout], [], [], self.startup_timeout)
        if not ready:
            raise UsageError(f"the local model server did not load the model within {self.startup_timeout:g} s; see {self.log_path}")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise UsageError(self._failure())
        address = json.loads(line)["address"].rstrip("/")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UsageError(self._failure())
            try:
                with urllib.request.urlopen(address + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return address
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise UsageError(f"the local model server did not become healthy within {self.startup_timeout:g} s; see {self.log_path}")

    def _failure(self) -> str:
        """One line on why the child died before serving."""
        code = self.proc.returncode
        tail = _tail(self.log_path)
        if code == -signal.SIGILL:
            return "the embedded llama.cpp server crashed with an illegal instruction: this CPU lacks instructions the xllamacpp wheel needs (AVX2); use a remote model or --api-base"
        if "address already in use" in tail.lower() or "failed to bind" in tail.lower() or "couldn't bind" in tail.lower():
            return f"port {self.requested_port} is in use; choose another port or leave it unset"
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "no output")
        return f"the local model server exited with code {code} before serving ({last.strip()[:200]}); see {self.log_path}"

    def stop(self, keep_log: bool = False) -> None:
        """Stop the server and its process group; idempotent."""
        atexit.unregister(self.stop)
        proc, self.proc, self.address = self.proc, None, None
        if proc is None:
            return
        if proc.stdin:
            try:
                proc.stdin.close()  # the child's cue to exit cleanly
            except OSError:
                pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc.stdout:
            proc.stdout.close()
        if self._own_log and not keep_log and self.log_path:
            self.log_path.unlink(missing_ok=True)

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (llamacpp:*), e.g. prompt_tokens_total."""
        with urllib.request.urlopen(self.address + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        values = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                values[name.removeprefix("llamacpp:")] = float(value)
        return values


def _check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} is in use; choose another port or leave it unset") from None
            raise UsageError(f"cannot use port {port} ({exc.strerror})") from None


def _tail(path: Optional[Path], limit: int = 4000) -> str:
    try:
        data = Path(path).read_bytes()
    except (OSError, TypeError):
        return ""
    return data[-limit:].decode(errors="replace")


def _serve(config: dict) -> int:
    """The child: load the model, announce the address, serve until stdin closes."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = config["model"]
    params.port = config["port"]  # 0: the OS picks a free port, so there is no race
    params.n_parallel = config["parallel"]
    params.n_ctx = config["n_ctx"]
    params.n_predict = config["max_tokens"]
    params.cpuparams.n_threads = config["threads"]
    params.cpuparams_batch.n_threads = config["threads"]
    params.model_alias = {ALIAS}  # a set: xllamacpp rejects a plain string
    params.use_jinja = True
    params.endpoint_metrics = True
    if config.get("chat_template"):
        params.chat_template = config["chat_template"]
    server = xllamacpp.Server(params)
    print(json.dumps({"address": server.listening_address}), flush=True)
    sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
    del server
    return 0


if __name__ == "__main__":
    raise SystemExit(_serve(json.loads(sys.argv[1])))
