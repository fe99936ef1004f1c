"""What candidate code may not reach, each under its rule: the modules, names and attributes that start
processes, open connections, load native code, read the environment, tamper with the interpreter, touch
files or call a model directly, or reach tau2's or evolver's internals; and the environment reads that are
allowed."""

from __future__ import annotations

import ast
import re

from evolver.data import AGENT_ENV

# Dotted names (a module, or a module's attribute) -> rule; a name matches when it
# or one of its prefixes is listed.
FORBIDDEN: dict[str, str] = {
    name: rule
    for rule, names in {
        "process": "subprocess multiprocessing pty signal _posixsubprocess posix nt concurrent.futures.process "
        "concurrent.futures.ProcessPoolExecutor os.system os.popen os.fork os.forkpty os.kill "
        "os.killpg os.setsid os._exit os.abort",
        "network": "socket _socket ssl http urllib urllib3 requests httpx aiohttp websockets websocket ftplib "
        "smtplib poplib imaplib nntplib telnetlib xmlrpc socketserver asyncio webbrowser",
        "native-code": "ctypes _ctypes cffi mmap",
        "environment": "os.environ os.environb os.getenv os.getenvb os.putenv os.unsetenv dotenv",
        "filesystem": "shutil os.chdir os.fchdir os.remove os.unlink os.rename os.renames os.replace os.rmdir "
        "os.removedirs os.makedirs os.mkdir os.symlink os.link os.chmod os.chown os.lchown "
        "os.truncate os.getcwd os.getcwdb os.path.expanduser pathlib.Path.home pathlib.Path.cwd",
        "interpreter": "importlib builtins gc inspect pickle _pickle marshal shelve dill copyreg atexit runpy code "
        "codeop pkgutil zipimport imp sys.modules sys.path sys.meta_path sys.path_hooks "
        "sys.path_importer_cache sys.settrace sys.setprofile sys._getframe sys.addaudithook "
        "threading.settrace threading.setprofile types.CodeType types.FunctionType",
        "model-settings": "litellm openai anthropic",
    }.items()
    for name in names.split()
}
FORBIDDEN_PATTERNS = [(re.compile(r"os\.(exec|spawn|posix_spawn)\w*"), "process")]

# Packages where only a few modules are allowed: root -> (rule, allowed modules).
ALLOWLISTS = {
    "tau2": ("tau2-internals", ("tau2.agent", "tau2.data_model.message", "tau2.utils.llm_utils")),
    "evolver": ("evolver-internals", ("evolver.toolcalls",)),
}

# Builtin names that run code, reach the builtins or open the debugger.
FORBIDDEN_NAMES = {name: "interpreter" for name in "exec eval compile __import__ __builtins__ globals breakpoint".split()}
FORBIDDEN_NAMES["environ"] = "environment"

# Attributes refused on any object: frames, code objects, the class graph, the environment.
FORBIDDEN_ATTRS = {
    name: "interpreter"
    for name in (
        "__subclasses__ __globals__ __code__ __closure__ __builtins__ __bases__ __mro__ __loader__ __spec__ "
        "__import__ f_back f_globals f_locals f_code f_builtins tb_frame gi_frame cr_frame ag_frame"
    ).split()
}
FORBIDDEN_ATTRS.update(environ="environment", parents="filesystem")
ENV_READERS = ("os.environ.get", "os.getenv")  # with one of AGENT_ENV's names written out: allowed
REFLECTIVE = ("getattr", "setattr", "delattr")
REFLECTED_MODULES = ("os", "sys", "posix", "io", "builtins", "importlib", "pathlib", "shutil")
TAU2_IN_TEXT = re.compile(r"\btau2(?:[./]\w+)+")


def refusal(dotted: str) -> tuple[str, str] | None:
    """(rule, the shortest refused prefix) for a dotted module or attribute name, or None if allowed."""
    parts = dotted.split(".")
    for prefix in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
        if rule := _refused(prefix):
            return rule, prefix
    return None


def _refused(name: str) -> str | None:
    root = name.split(".")[0]
    if root in ALLOWLISTS:
        rule, allowed = ALLOWLISTS[root]
        ok = name == root or any(name == a or name.startswith(a + ".") or a.startswith(name + ".") for a in allowed)
        return None if ok else rule
    return FORBIDDEN.get(name) or next((rule for pattern, rule in FORBIDDEN_PATTERNS if pattern.fullmatch(name)), None)


def star_rule(module: str) -> str | None:
    """A star import hides which names it brings in: refused if the module has any refused member."""
    if found := refusal(module):
        return found[0]
    return next((rule for name, rule in FORBIDDEN.items() if name.startswith(module + ".")), None)


def agent_env_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in AGENT_ENV
