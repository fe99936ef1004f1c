"""The static scan of a candidate's agent/ files: hostile code is refused, the harness's own idioms are not."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from evolver.evaluation.scan import scan_text, scan_tree
from evolver.evaluation.scan.findings import RULES, Finding
from evolver.evaluation.scan.taskdata import task_data_identifiers
from evolver.evolution.patch import apply_edits, parse_proposal

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "agent" / "templates"
TEMPLATE = (TEMPLATES / "tau_bench.py").read_text()
SIGNATURE = "    ) -> tuple[AssistantMessage, HarnessState]:\n"


def domain_identifiers(domain: str) -> frozenset[str]:
    import importlib

    module = importlib.import_module(f"tau2.domains.{domain}.environment")
    env = module.get_environment()
    tasks = [t.model_dump(mode="json") for t in module.get_tasks()]
    return task_data_identifiers(tasks, env.tools.db.model_dump(mode="json"), [t.name for t in env.get_tools()])


@pytest.fixture(scope="module")
def mock_ids() -> frozenset[str]:
    return domain_identifiers("mock")


@pytest.fixture
def agent_tree(tmp_path) -> Path:
    """A fresh agent/ as the scaffold makes it: the template as agent.py, its switches and skills."""
    agent = tmp_path / "agent"
    shutil.copytree(TEMPLATES, agent / "templates", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TEMPLATES / "tau_bench.py", agent / "agent.py")
    shutil.copy(TEMPLATES / "harness.toml", agent / "harness.toml")
    shutil.copytree(TEMPLATES / "skills", agent / "skills")
    return tmp_path


def inject(snippet: str, inside: bool) -> tuple[str, int]:
    """The template with snippet appended at module level or at the top of generate_next_message;
    returns the text and the line number of the snippet's first line."""
    if inside:
        head, tail = TEMPLATE.split(SIGNATURE)
        body = "".join(f"        {line}\n" for line in snippet.splitlines())
        return head + SIGNATURE + body + tail, (head + SIGNATURE).count("\n") + 1
    return TEMPLATE + "\n" + snippet + "\n", TEMPLATE.count("\n") + 2


# (id, snippet, module level or inside generate_next_message, expected rule, line within the snippet)
HOSTILE = [
    ("import-subprocess", "import subprocess", False, "process", 1),
    ("from-os-import-system", "from os import system", False, "process", 1),
    ("os-system", "import os\nos.system('id')", False, "process", 2),
    ("os-execv", "import os as o\no.execv('sh', ['sh'])", False, "process", 2),
    ("multiprocessing-alias", "import multiprocessing as mp", False, "process", 1),
    ("process-pool", "from concurrent.futures import ProcessPoolExecutor", False, "process", 1),
    ("signal", "import signal", False, "process", 1),
    ("star-import-os", "from os import *", False, "process", 1),
    ("socket", "import socket", False, "network", 1),
    ("urllib", "from urllib.request import urlopen", False, "network", 1),
    ("requests", "import requests", False, "network", 1),
    ("asyncio", "import asyncio", False, "network", 1),
    ("ctypes", "import ctypes", False, "native-code", 1),
    ("mmap", "import mmap", False, "native-code", 1),
    ("os-environ", "import os\nKEY = os.environ['OPENAI_API_KEY']", False, "environment", 2),
    ("os-getenv", "import os\nx = os.getenv('HOME')", True, "environment", 2),
    # Only AGENT_MODEL and AGENT_REASONING_EFFORT, each by its name written out, and only read.
    ("getenv-other-name", "import os\nKEY = os.environ.get('OPENAI_API_KEY', '')", False, "environment", 2),
    ("getenv-name-in-a-variable", "import os\nNAME = 'AGENT_MODEL'\nx = os.environ.get(NAME)", False, "environment", 3),
    ("getenv-built-name", "import os\nx = os.getenv('AGENT_' + 'MODEL')", False, "environment", 2),
    ("getenv-starred-name", "import os\nx = os.getenv(*['AGENT_MODEL'])", False, "environment", 2),
    (
        "getenv-default-reads-a-key",
        "import os\nx = os.environ.get('AGENT_MODEL', os.environ.get('OPENAI_API_KEY'))",
        False,
        "environment",
        2,
    ),
    ("environ-set-agent-model", "import os\nos.environ['AGENT_MODEL'] = 'gpt-4o'", False, "environment", 2),
    ("environ-listing", "import os\nnames = list(os.environ)", False, "environment", 2),
    ("environ-copy", "import os\nx = os.environ.copy()", False, "environment", 2),
    ("model-from-agent-model", "import os\nreply = generate(model=os.environ.get('AGENT_MODEL'), messages=[])", True, "model-settings", 2),
    ("model-fallback-first", "reply = generate(model=AGENT_MODEL or self.llm, messages=[])", True, "model-settings", 1),
    ("from-os-import-environ", "from os import environ", False, "environment", 1),
    ("open-absolute", "SECRET = open('/etc/passwd').read()", False, "filesystem", 1),
    ("dotdot-tasks", "x = (HERE / '..' / '..' / 'tasks.json').read_text()", True, "filesystem", 1),
    ("here-parent", "REPO = HERE.parent", False, "filesystem", 1),
    ("file-parent-parent", "REPO = Path(__file__).parent.parent", False, "filesystem", 1),
    ("parents", "REPO = Path(__file__).resolve().parents[1]", False, "filesystem", 1),
    ("dirname-twice", "import os\nREPO = os.path.dirname(os.path.dirname(__file__))", False, "filesystem", 2),
    ("path-home", "KEYS = Path.home() / '.config'", False, "filesystem", 1),
    ("shutil", "import shutil", False, "filesystem", 1),
    ("open-relative", "log = open('notes.txt', 'w')", True, "filesystem", 1),
    ("glob-absolute", "import glob\nfound = glob.glob('/root/*')", False, "filesystem", 2),
    ("os-remove", "import os\nos.remove(HERE / 'agent.py')", True, "filesystem", 2),
    ("home-literal", "KEY_FILE = '~/.ssh/id_rsa'", False, "filesystem", 1),
    ("fstring-absolute", "name = 'x'\np = f'/proc/{name}/environ'", True, "filesystem", 2),
    ("git-dir", "p = HERE / 'x' / '.git'", True, "filesystem", 1),
    ("sys-modules", "import sys\nsys.modules['tau2'].x = 1", False, "interpreter", 2),
    ("dunder-import", "os_module = __import__('os')", False, "interpreter", 1),
    ("eval", "value = eval('1 + 1')", True, "interpreter", 1),
    ("exec", "exec('x = 1')", False, "interpreter", 1),
    ("subclasses", "classes = ().__class__.__bases__[0].__subclasses__()", False, "interpreter", 1),
    ("globals-of-generate", "g = generate.__globals__", False, "interpreter", 1),
    ("getattr-dunder", "g = getattr(generate, '__glob' 'als__')", False, "interpreter", 1),
    ("importlib", "import importlib", False, "interpreter", 1),
    ("pickle", "import pickle", False, "interpreter", 1),
    ("inspect", "import inspect", False, "interpreter", 1),
    ("frame-walk", "import sys\nframe = sys._getframe(1)\ncaller = frame.f_back", True, "interpreter", 3),
    ("getattr-os", "import os\nrun = getattr(os, 'sys' + 'tem')", False, "interpreter", 2),
    ("evaluator", "from tau2.evaluator.evaluator import EvaluationType", False, "tau2-internals", 1),
    ("registry", "from tau2.registry import registry", False, "tau2-internals", 1),
    ("data-dir", "import tau2.agent.base\nDATA = tau2.utils.utils.DATA_DIR", False, "tau2-internals", 2),
    ("user-simulator", "from tau2.user.user_simulator import UserSimulator", False, "tau2-internals", 1),
    ("tasks-model", "from tau2.data_model.tasks import Task", False, "tau2-internals", 1),
    ("from-tau2-import", "from tau2 import orchestrator", False, "tau2-internals", 1),
    ("tau2-path-text", "p = 'tau2/domains/retail/policy.md'", False, "tau2-internals", 1),
    ("environment-tool", "from tau2.environment.tool import Tool", False, "tau2-internals", 1),
    ("evolver-config", "from evolver.config import load_config", False, "evolver-internals", 1),
    ("model-literal", "reply = generate(model='gpt-4o', tools=[], messages=[])", True, "model-settings", 1),
    ("temperature", "reply = generate(model=self.llm, messages=[], temperature=0)", True, "model-settings", 1),
    ("assign-llm", "self.llm = 'openai/gpt-4o'", True, "model-settings", 1),
    ("llm-args-item", "self.llm_args['temperature'] = 0", True, "model-settings", 1),
    ("llm-args-update", "self.llm_args.update({'x': 1})", True, "model-settings", 1),
    ("api-base-key", "args = {**self.llm_args, 'api_base': 'http://10.0.0.1'}", True, "model-settings", 1),
    ("setattr-llm", "setattr(self, 'llm', 'gpt-4o')", True, "model-settings", 1),
    ("llm-property", "class Sneaky(HarnessAgent):\n    @property\n    def llm(self):\n        return 'gpt-4o'", False, "model-settings", 3),
    ("litellm", "import litellm", False, "model-settings", 1),
    ("task-data-prompt", "HINT = 'The account is user_1.'", False, "task-data", 1),
    ("task-id", "if 'create_task_1' in str(state):\n    pass", True, "task-data", 1),
    ("task-data-multiline", "NOTE = '''\nfirst line\nuse task_2 here\n'''", False, "task-data", 3),
    ("task-data-comment", "x = 1  # the test user is user_1", False, "task-data", 1),
    ("task-data-fstring", "n = 1\nmsg = f'user_1 has {n} tasks'", True, "task-data", 2),
    # the failure digest's masked values: the 1.5B's fixed customer message in place of state_reset's reset, kept by the scripted gate
    (
        "digest-placeholder",
        "state.messages = [UserMessage(role='user', content=\"create a task called '<V1>' for <V2>.\")]",
        True,
        "task-data",
        1,
    ),
    ("digest-placeholder-comment", "x = 1  # as in T1: <V3>", False, "task-data", 1),
    ("not-python", "def broken(:\n    pass", False, "unreadable", 1),
]


@pytest.mark.parametrize("snippet, inside, rule, line", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_code_is_refused_at_its_line(snippet, inside, rule, line, mock_ids):
    text, first = inject(snippet, inside)
    findings = scan_text("agent/agent.py", text, mock_ids)
    assert (rule, first + line - 1) in {(f.rule, f.line) for f in findings}, findings
    last = first + snippet.count("\n")
    assert all(first <= f.line <= last for f in findings), findings  # nothing of the template's own


def test_there_are_enough_hostile_cases_for_every_rule():
    assert len(HOSTILE) >= 30
    assert {c[3] for c in HOSTILE} == set(RULES)


def test_a_finding_is_one_line_with_its_reason():
    finding = Finding("process", "agent/agent.py", 12, "import subprocess")
    assert str(finding) == "agent/agent.py:12: process: import subprocess (candidate code may not start processes or send signals)"
    text, first = inject("x = 1\ny = 2\nimport subprocess", inside=False)
    assert [str(f) for f in scan_text("agent/agent.py", text)] == [
        f"agent/agent.py:{first + 2}: process: import subprocess ({RULES['process']})"
    ]


def test_text_files_are_checked_for_task_data(mock_ids):
    skill = "# Look up tasks\n\nUse when the user asks about a task.\n1. Ask for the user id (like user_1).\n"
    [finding] = scan_text("agent/skills/look-up.md", skill, mock_ids)
    assert (finding.rule, finding.line) == ("task-data", 4) and "user_1" in finding.detail
    assert scan_text("agent/harness.toml", 'h2_action_realization = true\nnote = "task_2"\n', mock_ids)[0].line == 2
    assert scan_text("agent/skills/look-up.md", skill) == []  # no identifiers given: nothing to find


# ---- no over-blocking ----------------------------------------------------------------------


def test_the_template_passes_with_every_domains_identifiers(mock_ids):
    assert scan_text("agent/agent.py", TEMPLATE, mock_ids) == []
    assert scan_text("agent/agent.py", TEMPLATE, domain_identifiers("retail")) == []


BENIGN = [
    ("slash-join", 'SEP = "/".join(["a", "b"])', False),
    ("no-think-prompt", 'PROMPT = "/no_think\\n" + AGENT_INSTRUCTION', False),
    ("prose-with-dots", 'NOTE = "Wait... then retry; about ~5 steps; see ../ in the docs"', False),
    ("local-named-code", 'code = "x"\nsignal = code.upper()', True),
    ("threads", "import threading\nfrom concurrent.futures import ThreadPoolExecutor\nLOCK = threading.Lock()", False),
    ("time-random-math", "import math, random, time\nrng = random.Random(0)\nx = math.log(2) + time.monotonic()", False),
    (
        "own-files",
        'import os\nextra = open(HERE / "notes.txt").read()\nfiles = sorted((HERE / "skills").glob("*.md"))\n'
        'folder = os.path.join(HERE, "skills")',
        False,
    ),
    ("allowed-tau2", "from tau2.agent.base import LocalAgent\nfrom tau2.data_model.message import ToolCall", False),
    ("model-copy-and-dict", 'copy = reply.model_copy(update={"content": "x"})\nshape = {"model": 1, "name": "n"}', True),
    ("regex", 'ID = re.compile(r"^[a-z]+_\\d+$")', False),
    ("read-llm-args", "budget = self.llm_args.get('max_tokens')\nname = str(self.llm)", True),
    # auto-harness's idioms: the two names evolver gives the agent process, and the model as self.llm first.
    (
        "agent-model-env",
        "import os\nAGENT_MODEL = os.environ.get('AGENT_MODEL', '')\nEFFORT = os.getenv('AGENT_REASONING_EFFORT')\n"
        "NAME = os.environ['AGENT_MODEL']",
        False,
    ),
    (
        "model-self-llm-or",
        "import os\neffort = os.environ.get('AGENT_REASONING_EFFORT', '')\nkw = {'reasoning_effort': effort} if effort else {}\n"
        "kw.update(self.llm_args)\nreply = generate(model=self.llm or AGENT_MODEL, tools=self.tools, messages=[], **kw)",
        True,
    ),
]


@pytest.mark.parametrize("snippet, inside", [c[1:] for c in BENIGN], ids=[c[0] for c in BENIGN])
def test_benign_code_passes(snippet, inside, mock_ids):
    assert scan_text("agent/agent.py", inject(snippet, inside)[0], mock_ids) == []


def test_a_fresh_agent_tree_passes_and_templates_are_skipped(agent_tree, mock_ids):
    assert scan_tree(agent_tree, mock_ids) == []
    (agent_tree / "agent" / "templates" / "evil.py").write_text("import subprocess\n")
    (agent_tree / "agent" / "__pycache__").mkdir()
    (agent_tree / "agent" / "__pycache__" / "evil.py").write_text("import subprocess\n")
    assert scan_tree(agent_tree, mock_ids) == []


def test_a_tree_reports_sorted_findings_symlinks_and_unreadable_files(agent_tree, mock_ids):
    agent = agent_tree / "agent"
    (agent / "skills" / "leak.md").write_text("# Leak\nUse when task_1 comes up.\n")
    (agent / "helpers.py").write_text("import socket\n\n\nimport ctypes\n")
    (agent / "passwd.txt").symlink_to("/etc/passwd")
    (agent / "binary.json").write_bytes(b"\xff\xfe")
    found = [(f.path, f.line, f.rule) for f in scan_tree(agent_tree, mock_ids)]
    assert found == [
        ("agent/binary.json", 1, "unreadable"),
        ("agent/helpers.py", 1, "network"),
        ("agent/helpers.py", 4, "native-code"),
        ("agent/passwd.txt", 1, "filesystem"),
        ("agent/skills/leak.md", 2, "task-data"),
    ]


def guide_examples() -> list[str]:
    examples = re.findall(r"```\n(TITLE:.*?)```", (ROOT / "Harness.md").read_text(), re.S)
    assert len(examples) == 5  # the format, then one example per layer
    return examples[1:]


VALID_PATCHES = {
    "prompt-text": """TITLE: Ask one question at a time
RATIONALE: Users were asked several things at once.
FILE: agent/agent.py
<<<<<<< SEARCH
Try to be helpful and always follow the policy.
=======
Try to be helpful and always follow the policy.
Ask the user one question at a time, and read ids back to them before you act.
>>>>>>> REPLACE
""",
    "helper-with-re-json-collections": '''TITLE: Note repeated arguments
RATIONALE: The same id was passed to several tools without a lookup.
FILE: agent/agent.py
<<<<<<< SEARCH
def budget_note(messages: list, step_budget: int) -> Optional[str]:
=======
ID_LIKE = re.compile(r"^[A-Za-z]+_\\d+$")


def argument_counts(messages: list) -> Counter:
    """How often each argument value was used, so a guessed id shows up as an outlier."""
    counts = Counter()
    for m in messages:
        for call in getattr(m, "tool_calls", None) or []:
            counts.update(json.dumps(v, sort_keys=True) for v in call.arguments.values())
    return counts


def budget_note(messages: list, step_budget: int) -> Optional[str]:
>>>>>>> REPLACE
''',
    "threading-lock-and-state-field": """TITLE: Remember who was verified
RATIONALE: The agent asked twice for the same identity details.
FILE: agent/agent.py
<<<<<<< SEARCH
import json
=======
import json
import threading
>>>>>>> REPLACE
<<<<<<< SEARCH
    h5_skills: list[str] = Field(default_factory=list)  # skills in the latest context
=======
    h5_skills: list[str] = Field(default_factory=list)  # skills in the latest context
    verified: list[str] = Field(default_factory=list)  # who the user proved to be
>>>>>>> REPLACE
<<<<<<< SEARCH
H5_TOP_K = 2
=======
H5_TOP_K = 3
SKILL_LOCK = threading.Lock()  # tau2 may run simulations in threads
>>>>>>> REPLACE
<<<<<<< SEARCH
    skills = load_skills(HERE / "skills")
=======
    with SKILL_LOCK:
        skills = load_skills(HERE / "skills")
    notes = (HERE / "notes.txt").read_text() if (HERE / "notes.txt").exists() else ""
>>>>>>> REPLACE
FILE: agent/skills/look-up-then-act.md
<<<<<<< SEARCH
=======
# Look up, then act

Use when the user gives an id, a name or an email and wants something changed.
1. Find the record with a lookup tool first; ids have the form the tool descriptions give.
2. Act only on what the lookup returned.
>>>>>>> REPLACE
""",
}


@pytest.mark.parametrize(
    "proposal", guide_examples() + list(VALID_PATCHES.values()), ids=["guide-H2", "guide-H3", "guide-H4", "guide-H5", *VALID_PATCHES]
)
def test_valid_patches_pass(proposal, agent_tree, mock_ids):
    written = apply_edits(agent_tree, parse_proposal(proposal).edits)
    assert written
    assert scan_tree(agent_tree, mock_ids) == []
    assert scan_tree(agent_tree, domain_identifiers("retail")) == []


# ---- identifiers from task data ------------------------------------------------------------


def test_mock_identifiers(mock_ids):
    from tau2.domains.mock.environment import get_tasks

    assert {"user_1", "task_1"} <= mock_ids
    assert {t.id for t in get_tasks()} <= mock_ids
    assert not {"create_task", "get_users", "update_task_status", "transfer_to_human_agents"} & mock_ids


def test_retail_identifiers_are_quick_and_hold_order_ids():
    from tau2.domains.retail.environment import get_environment, get_tasks

    env = get_environment()
    tasks = [t.model_dump(mode="json") for t in get_tasks()]
    db = env.tools.db.model_dump(mode="json")
    start = time.thread_time()  # this thread's CPU time: what the scan costs, not how busy the machine is
    ids = task_data_identifiers(tasks, db, [t.name for t in env.get_tools()])
    assert time.thread_time() - start < 2
    assert {"#W2378156", "W2378156", "19122", "credit_card_9513926"} <= ids
    assert not {"0", "7", "get_order_details"} & ids  # short numeric task ids would block every constant
    text, first = inject("ORDER = '#W2378156'\nZIP = 19122", inside=False)
    assert [(f.rule, f.line) for f in scan_text("agent/agent.py", text, ids)] == [("task-data", first), ("task-data", first + 1)]


def test_what_looks_like_an_identifier():
    tasks = [
        {
            "id": "[mms_issue]airplane_mode_on[PERSONA:None]",
            "user_scenario": {
                "instructions": "You are mia_garcia_4516, phone 555-123-4567, order #W2378156; HATHAT, 2024, born 1990-01-02."
            },
            "evaluation_criteria": {"actions": [{"arguments": {"amount": 123456, "count": 2, "flag": True}}]},
        }
    ]
    ids = task_data_identifiers(tasks, {"users": {"user_1": {"zip": "90210", "name": "Ann"}}}, exclude=["user_1"])
    assert ids == {
        "[mms_issue]airplane_mode_on[PERSONA:None]",
        "mia_garcia_4516",
        "555-123-4567",
        "#W2378156",
        "W2378156",
        "1990-01-02",
        "123456",
        "90210",
    }
    found = scan_text("agent/agent.py", "TASK = 'see [mms_issue]airplane_mode_on[PERSONA:None]'\n", ids)
    assert [f.rule for f in found] == ["task-data"]


def test_any_text_gives_findings_never_an_exception(mock_ids):
    import random

    rng = random.Random(3)
    texts = ["x = " + "-" * 100_000 + "1", "(" * 1000, "x = 1\x00", "a" + " + a" * 50_000, "'''", "\udc80", "#" + "\x00" * 5]
    texts += ["".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(300)) for _ in range(100)]
    texts += ["\n".join(rng.choice(TEMPLATE.splitlines()) for _ in range(40)) for _ in range(100)]
    for text in texts:
        for path in ("agent/agent.py", "agent/skills/x.md"):
            assert all(f.rule in RULES for f in scan_text(path, text, mock_ids))
    assert scan_text("agent/agent.py", "(" * 1000)[0].rule == "unreadable"


def test_the_auto_harness_shaped_fixture_passes_the_scan(mock_ids):
    """auto-harness's tau-bench template shape (tests/fixtures/auto_harness) is a valid parent for candidates as it is."""
    text = (ROOT / "tests" / "fixtures" / "auto_harness" / "agent" / "agent.py").read_text()
    assert (
        'os.environ.get("AGENT_MODEL"' in text and "from tau2.agent.base_agent import" in text and "model=self.llm or AGENT_MODEL" in text
    )
    assert scan_text("agent/agent.py", text, mock_ids) == []
    assert scan_text("agent/agent.py", text, domain_identifiers("retail")) == []


def test_every_parse_of_python_in_evolver_takes_the_one_lock():
    """CPython 3.11's ast.parse is not safe in two threads at once (gh-106905): an iteration's candidates are
    proposed in threads, and a bare parse there failed a CI run with "AST constructor recursion depth mismatch"."""
    import ast

    root = Path(__file__).resolve().parent.parent / "evolver"
    bare = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and (node.func.value.id, node.func.attr) in {("ast", "parse"), ("symtable", "symtable")}
            ):  # symtable parses too
                bare.append(f"{path.relative_to(root)}:{node.lineno}")
    assert bare == ["evaluation/scan/__init__.py:94", "evaluation/scan/__init__.py:100"]  # parse_python and symbol_table, under its lock
