"""Proposal parsing, the allowlist, the proposer's retries, prompt fitting, and digest masking."""

from __future__ import annotations

import json

import pytest

from evolver.cli.start import PROMPTS_DIR
from evolver.data import RoleModel, SimRecord
from evolver.errors import UsageError
from evolver.evolution.digest import build_digest
from evolver.evolution.patch import Edit, ParseError, PatchRejected, apply_edits, check_path, parse_proposal
from evolver.evolution.proposers.agent_source import agent_texts, named_lines, versions
from evolver.evolution.proposers.oneshot import build_messages, propose
from tests.conftest import ROOT, failed_evaluation

AGENT = 'AGENT_INSTRUCTION = """\nBe nice.\n"""\n\n\ndef f():\n    return 1\n'


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.py").write_text(AGENT)
    return tmp_path


def test_parse_two_files_and_multiline_rationale():
    text = (
        "Here you go.\nTITLE: Two edits\nRATIONALE: Pattern 1 and\nPattern 2.\n"
        "FILE: agent/agent.py\n<<<<<<< SEARCH\nBe nice.\n=======\nBe exact.\n>>>>>>> REPLACE\n"
        "FILE: agent/skills/titles.md\n<<<<<<< SEARCH\n=======\nKeep titles verbatim.\n>>>>>>> REPLACE\n"
    )
    p = parse_proposal(text)
    assert p.title == "Two edits" and p.rationale == "Pattern 1 and\nPattern 2."
    assert [(e.path, e.search, e.replace) for e in p.edits] == [
        ("agent/agent.py", "Be nice.", "Be exact."),
        ("agent/skills/titles.md", "", "Keep titles verbatim."),
    ]


def test_labels_written_as_markdown_are_labels_and_a_repeated_edit_counts_once():
    """The prompt's headings are markdown: the 1.5B answered "# TITLE: ..." three times, told each time there was no TITLE line."""
    p = parse_proposal(
        "# TITLE: Keep results\n**RATIONALE:** they were lost\n## FILE: agent/agent.py\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n"
        "# Pattern 2: ended by max_steps\n"
    )
    assert (p.title, p.rationale, [(e.path, e.search, e.replace) for e in p.edits]) == (
        "Keep results",
        "they were lost",
        [("agent/agent.py", "a", "b")],
    )
    # an answer repeated whole: its edit once (applied twice, the second SEARCH would not be found)
    block = "FILE: agent/agent.py\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n"
    assert len(parse_proposal(f"TITLE: t\n{block}TITLE: t\n{block}").edits) == 1
    assert len(parse_proposal(f"TITLE: t\n{block}{block.replace('b', 'c')}").edits) == 2


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("FILE: agent/agent.py\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "no 'TITLE"),
        ("TITLE: x\nRATIONALE: y\n", "no edit blocks"),
        ("TITLE: x\nFILE: agent/agent.py\n<<<<<<< SEARCH\na\n=======\nb\n", "not closed"),
        ("TITLE: x\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", "must follow a 'FILE"),
    ],
)
def test_malformed_proposals(text, fragment):
    with pytest.raises(ParseError, match=fragment):
        parse_proposal(text)


@pytest.mark.parametrize(
    "path",
    ["evolver/cli/commands.py", "agent/templates/tau_bench.py", "agent/../evolver/cli/commands.py", "/etc/passwd", "agent", "Harness.md"],
)
def test_allowlist_refuses(path):
    with pytest.raises(PatchRejected) as exc:
        check_path(path)
    assert not exc.value.retryable


def test_apply_checks_everything_before_writing(tree):
    good = Edit("agent/agent.py", "Be nice.", "Be exact.")
    with pytest.raises(PatchRejected, match="does not parse") as exc:
        apply_edits(tree, [good, Edit("agent/agent.py", "    return 1", "    return (")])
    assert not exc.value.retryable
    assert (tree / "agent" / "agent.py").read_text() == AGENT  # nothing written
    with pytest.raises(PatchRejected, match="not found") as exc:
        apply_edits(tree, [Edit("agent/agent.py", "Be rude.", "x")])
    assert exc.value.retryable
    with pytest.raises(PatchRejected, match="found 2 times"):
        apply_edits(tree, [Edit("agent/agent.py", '"""', "'''")])
    apply_edits(tree, [good, Edit("agent/skills/new.md", "", "A skill.")])
    assert "Be exact." in (tree / "agent" / "agent.py").read_text()
    assert (tree / "agent" / "skills" / "new.md").read_text() == "A skill.\n"
    # Creating a file that exists: refused, unless it "creates" it exactly as it is (a small meta-LLM
    # copying Harness.md's example skill beside a real change): then that edit changes nothing.
    with pytest.raises(PatchRejected, match="but it exists") as exc:
        apply_edits(tree, [Edit("agent/skills/new.md", "", "Another skill.")])
    assert exc.value.retryable and (tree / "agent" / "skills" / "new.md").read_text() == "A skill.\n"
    written = apply_edits(tree, [Edit("agent/skills/new.md", "", "A skill.\n\n"), Edit("agent/agent.py", "Be exact.", "Be brief.")])
    assert (tree / "agent" / "skills" / "new.md").read_text() == "A skill.\n" and "Be brief." in written["agent/agent.py"]


@pytest.fixture
def template(tmp_path):
    """The template agent (its instruction reaches the model: a patch of it can change a simulation)."""
    import shutil

    shutil.copytree(ROOT / "agent", tmp_path / "agent", ignore=shutil.ignore_patterns("templates", "__pycache__"))
    return tmp_path


def _messages():
    return [{"role": "system", "content": "guide"}, {"role": "user", "content": "fix it"}]


def test_proposer_sends_format_errors_back(template, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:sloppy_meta")
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR)
    assert out.proposal is not None and out.proposal.title == "Keep the user's exact title"
    assert len(out.responses) == 2 and "no 'TITLE" in out.errors[0]
    assert out.usage.prompt_tokens > 0


def test_a_patch_the_loop_would_not_measure_is_sent_back(template, monkeypatch):
    """The 1.5B's one-shot patches were refused unmeasured, two of six as an earlier candidate's agent/ again, two as
    edits of layers that are off: each a proposal spent. Now the meta-LLM is told why and answers again."""
    from evolver.evolution.evidence import EarlierCandidate
    from evolver.evolution.noop import agent_digest, agent_files

    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:revising_meta")
    agent = template / "agent" / "agent.py"
    original = agent.read_text()
    agent.write_text(
        original.replace('AGENT_INSTRUCTION = """\n', 'AGENT_INSTRUCTION = """\nAlways transfer the user to a human agent.\n', 1)
    )
    rejected = EarlierCandidate(
        label="1",
        title="Transfer everyone",
        status="rejected",
        reason="worse (-40.0 points over 5 tasks)",
        agent=agent_digest(agent_files(template)),
    )
    agent.write_text(original)
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR, earlier=[rejected])
    assert out.proposal is not None and out.proposal.title == "Keep the user's exact title" and out.refused is None
    assert out.errors == [
        "it makes agent/ the same as candidate 1's, which was rejected: worse (-40.0 points over 5 tasks)",
        "its edits change only comments, layout or a docstring, not code: they cannot change a simulation",
    ]
    assert len(out.responses) == 3 and agent.read_text() == original  # the checkout is only read
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR, max_attempts=2, earlier=[rejected])
    assert out.proposal is None and len(out.responses) == 2  # the attempts are bounded as for a format error


def test_code_that_does_not_parse_is_sent_back_with_the_parsers_message_while_attempts_remain(template, monkeypatch):
    """Offered a removal that keeps the line above it, the 1.5B wrote REPLACE empty three times: three invalid candidates,
    three iterations spent, none caught as a repeat (an unparsed candidate has no tree to compare)."""
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:unparsed_meta")
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR)
    assert out.proposal is not None and out.proposal.title == "Keep the user's exact title" and len(out.responses) == 2
    assert len(out.errors) == 1 and out.errors[0].startswith("agent/agent.py does not parse: "), out.errors
    # when no attempt remains, it is measured as it is: the loop judges it invalid with the same message
    monkeypatch.setenv("EVOLVER_TEST_TOLD", "0")
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR, max_attempts=2)
    assert out.proposal is not None and out.proposal.title == "Drop the instruction" and len(out.responses) == 2


def test_lines_given_back_unchanged_are_told_so(template):
    """Given the lines to start from, the 1.5B answered them back unchanged three times and was told only that agent/ was as it was."""
    from evolver.evolution.proposers.oneshot import _dry_run

    same = parse_proposal(
        'TITLE: t\nRATIONALE: r\nFILE: agent/agent.py\n<<<<<<< SEARCH\nAGENT_INSTRUCTION = """\n=======\nAGENT_INSTRUCTION = """\n>>>>>>> REPLACE\n'
    )
    assert _dry_run(template, same, frozenset(), []) == (
        [],
        "it leaves agent/ as it was: its lines after ======= are its SEARCH lines "
        "unchanged; write them as they should be, corrected or without what does harm",
        "",
    )


def test_a_copy_of_a_guide_example_is_sent_back_while_attempts_remain(template, monkeypatch):
    """Every one-shot patch of the 1.5B that reached the gate copied one of the guide's examples, whatever the digest said:
    it is told so and answers again; on the last attempt the copy is measured like any patch."""
    from evolver.evolution.patch import parse_proposal
    from evolver.evolution.proposers.oneshot import copied_example
    from tests.scripts.loop_cases import COPIED, PROPOSALS

    guide = (PROMPTS_DIR / "Harness.md").read_text()
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:copying_meta")
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR, guide=guide)
    assert out.proposal is not None and out.proposal.title == "Keep the user's exact title" and len(out.responses) == 2
    assert out.errors == [
        "it is the guide's example patch 'Nudge the agent back to the user sooner': the examples show the format, "
        "not a fix for these failures"
    ]
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR, guide=guide, max_attempts=1)
    assert out.proposal is not None and out.proposal.title == "Nudge the agent back to the user sooner" and not out.errors
    # Only a patch whose every edit besides the switches is the guide's text: switching a layer alone, or the example's lines
    # changed otherwise, are the proposal's own.
    assert copied_example(parse_proposal(COPIED), guide) == "Nudge the agent back to the user sooner"
    switch_only = "TITLE: t\nRATIONALE: r\n" + COPIED[COPIED.index("FILE: agent/harness.toml") :]
    own = COPIED.replace("H4_CALLS_WITHOUT_USER = 5", "H4_CALLS_WITHOUT_USER = 6")
    assert copied_example(parse_proposal(switch_only), guide) == copied_example(parse_proposal(own), guide) == ""
    assert copied_example(parse_proposal(PROPOSALS[3]), guide) == copied_example(parse_proposal(COPIED), "") == ""


def test_a_search_found_nowhere_is_answered_with_the_lines_most_like_it(template, monkeypatch):
    from evolver.evolution.patch import closest_lines

    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:misquoting_meta")
    out = propose(RoleModel(model="scripted/meta"), _messages(), template, prompts_dir=PROMPTS_DIR)
    assert out.proposal is not None and out.proposal.title == "Keep the user's exact title" and len(out.responses) == 2
    assert out.errors[0].startswith("edit 1: SEARCH text for agent/harness.toml not found") and "\n" not in out.errors[0]  # one line
    assert closest_lines("a = 1\nb = 2\nc = 3\n", "b = 3") == "b = 2" and closest_lines("a = 1\nb = 2\n", "nothing alike at all") == ""


def test_proposer_gives_up_after_bounded_attempts(tree, monkeypatch):
    monkeypatch.setenv("EVOLVER_SCRIPT", "tests.scripts.loop_cases:prose_meta")
    out = propose(RoleModel(model="scripted/meta"), _messages(), tree, prompts_dir=PROMPTS_DIR, max_attempts=3)
    assert out.proposal is None and len(out.responses) == 3


def test_prompt_is_shrunk_to_the_context():
    history = [f"- Iteration {i}: something -> rejected." for i in range(200)]
    msgs = build_messages(PROMPTS_DIR, "guide", ["agent source"], "digest " * 2000, history, context_tokens=6000)
    total = sum(len(m["content"]) for m in msgs)
    assert total <= (6000 - 2500) * 4
    assert "older attempts omitted" in msgs[1]["content"] and "- Iteration 199:" in msgs[1]["content"]
    # the lines to start from are never cut with the digest: cut, the 1.5B copied the prompt on from where they ended
    start = "FILE: agent/agent.py\n<<<<<<< SEARCH\n" + "        state.messages = []\n" * 40 + "======="
    user = build_messages(PROMPTS_DIR, "guide", ["agent source"], "digest " * 2000, history, context_tokens=6000, start=start)[1]["content"]
    assert user.endswith(f"# Where to start\n\n{start}\n") and "(digest cut to fit the context)" in user  # last: nothing to copy on
    assert "Nothing in particular" in msgs[1]["content"]
    with pytest.raises(UsageError, match="meta_context_tokens"):
        build_messages(PROMPTS_DIR, "guide " * 4000, ["agent"], "digest", [], context_tokens=3000)


def test_the_agent_files_are_shown_in_part_before_the_digest_is_cut(template):
    """With the embedded model's context the guide and agent/ left about 1,300 characters of an 8,000-character digest: the
    functions the failures do not point to are shortened first, the largest first, and the ones they point to stay whole."""
    (template / "agent" / "broken.py").write_text("def f(:\n" + "    x = 1\n" * 30)  # shown whole: it does not parse
    files = agent_texts(template)
    turn, fit = (ROOT / "agent" / "agent.py").read_text(), "def fit_value("
    first = turn[: turn.index(fit)].count("\n") + 1  # fit_value's first line: named, so kept whole
    digest = (
        f"The harness changed ...: -> agent/agent.py lines {first}-{first + 2} (fit_value) first.\n" + "- T1 failed the same way\n" * 300
    )
    shown = versions(files, named_lines([digest]))
    assert len(shown) > 5 and [len(v) for v in shown] == sorted((len(v) for v in shown), reverse=True)
    guide = (ROOT / "Harness.md").read_text()
    user = build_messages(PROMPTS_DIR, guide, shown, digest, [], context_tokens=12288)[1]["content"]
    assert digest in user and "digest cut" not in user  # whole, where the files whole would have cut it
    assert "digest cut" in build_messages(PROMPTS_DIR, guide, shown[:1], digest, [], context_tokens=12288)[1]["content"]
    kept = turn[turn.index(fit) : turn.index("\ndef ", turn.index(fit) + 1)]
    assert kept in user and "def generate_next_message(" in user and "    x = 1\n" * 30 in user
    elided = [line for line in user.splitlines() if "not shown: the failures do not point here" in line]
    assert elided and all(line.strip().startswith("...  # lines ") for line in elided)
    assert user.count("def realize_action(") == 1 and "Not executed because another call" not in user  # the largest is shortened first
    assert build_messages(PROMPTS_DIR, guide, shown, digest, [], context_tokens=32768)[1]["content"].count("not shown") == 0


def test_digest_masks_data_and_keeps_procedure(tmp_path):
    messages = [
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "Please create a task called 'Secret Launch' for user_7 costing $1234."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"name": "create_task", "arguments": {"user_id": "user_7", "title": "secret launch"}}],
        },
        {"role": "tool", "content": json.dumps({"task_id": "task_9", "title": "secret launch", "status": "pending"}), "error": False},
    ]
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "t.json").write_text(json.dumps({"messages": messages}))
    breakdown = {
        "reward": 0.0,
        "db_check": {"db_match": False},
        "action_checks": [
            {"action": {"name": "create_task", "arguments": {"user_id": "user_7", "title": "Secret Launch"}}, "action_match": False}
        ],
    }
    rec = SimRecord(
        task_id="secret_task_id",
        trial=0,
        outcome="ok",
        reward=0.0,
        reward_breakdown=breakdown,
        termination_reason="user_stop",
        steps=4,
        trajectory_file="trajectories/t.json",
    )
    result = failed_evaluation([rec])
    digest = build_digest(result, tmp_path)
    for secret in ("Secret Launch", "secret launch", "user_7", "task_9", "1234", "secret_task_id"):
        assert secret not in digest
    assert "expected action missing or wrong: create_task(user_id, title)" in digest
    assert "wrong final database state" in digest and "status" in digest and "pending" in digest
    assert "create_task(user_id=<V" in digest


def test_the_digest_tells_a_repeated_call_once_with_its_count(tmp_path):
    call = {"role": "assistant", "content": None, "tool_calls": [{"name": "create_task", "arguments": {"title": "x1"}}]}
    other = {"role": "assistant", "content": None, "tool_calls": [{"name": "list_tasks", "arguments": {}}]}
    (tmp_path / "t.json").write_text(json.dumps({"messages": [call, call, call, other, call]}))
    rec = SimRecord(task_id="t", trial=0, outcome="ok", reward=0.0, termination_reason="max_steps", steps=5, trajectory_file="t.json")
    result = failed_evaluation([rec])
    assert "agent did: create_task(title=<V1>), 3 times in a row; list_tasks(); create_task(title=<V1>); ended by" in build_digest(
        result, tmp_path
    )


# ---- hostile paths and text ----------------------------------------------------------------


def _hostile_tree(root):
    """Dangerous shapes inside agent/: a folder, a symlink out, a symlinked folder."""
    (root / "agent" / "skills").mkdir()
    (root / "agent" / "passwd.md").symlink_to("/etc/passwd")
    (root / "outside").mkdir()
    (root / "agent" / "linked").symlink_to(root / "outside", target_is_directory=True)


BAD_PATHS = [
    ("nul-byte", "agent/x\x00.py", "control character"),
    ("control-char", "agent/x\x1b[2J.py", "control character"),
    ("newline", "agent/x.py\nFILE: evolver/cli/commands.py", "control character"),
    ("long-name", "agent/" + "a" * 300 + ".py", "longer than 200"),
    ("long-component", "agent/" + "a" * 120 + ".py", "longer than 100"),
    ("directory", "agent/skills", "only .py"),
    ("directory-with-suffix", "agent/skills.md", "it is a folder"),  # made a folder below
    ("symlink-to-passwd", "agent/passwd.md", "is a symlink"),
    ("symlinked-parent", "agent/linked/x.md", "agent/linked is a symlink"),
    ("dotdot", "agent/../evolver/x.py", "only files under agent/"),
    ("absolute", "/abs", "only files under agent/"),
    ("hidden-file", "agent/.hidden.py", "hidden"),
    ("hidden-dir", "agent/.git/config.txt", "hidden"),
    ("exe", "agent/x.exe", "only .py, .toml"),
    ("backslash", "agent\\x.py", "'\\\\'"),
    ("space", "agent/my file.py", "' '"),
    ("unicode", "agent/\u0430gent.py", "characters outside"),
    ("trailing-slash", "agent/", "empty"),
    ("double-slash", "agent//x.py", "empty"),
    ("dot-component", "agent/./x.py", "'.' path component"),
    ("empty", "", "empty"),
    ("templates", "agent/templates/tau_bench.py", "pristine"),
]


@pytest.mark.parametrize("path, fragment", [c[1:] for c in BAD_PATHS], ids=[c[0] for c in BAD_PATHS])
def test_hostile_paths_are_refused_in_one_line(path, fragment, tree):
    _hostile_tree(tree)
    (tree / "agent" / "skills.md").mkdir()
    with pytest.raises(PatchRejected) as exc:
        apply_edits(tree, [Edit(path, "", "hello")])
    message = str(exc.value)
    assert "\n" not in message and "\x00" not in message and len(message) < 200, message
    assert fragment in message, message
    assert not exc.value.retryable
    assert (tree / "outside").exists() and not any((tree / "outside").iterdir())
    assert open("/etc/passwd").read() != "hello\n"


def test_unreadable_and_unwritable_targets_are_refusals(tree):
    (tree / "agent" / "latin1.md").write_bytes(b"caf\xe9\n")
    with pytest.raises(PatchRejected, match=r"cannot be read \(UnicodeDecodeError\)"):
        apply_edits(tree, [Edit("agent/latin1.md", "caf", "tea")])
    with pytest.raises(PatchRejected, match="agent/agent.py is not a folder"):
        apply_edits(tree, [Edit("agent/agent.py/x.md", "", "x")])
    with pytest.raises(PatchRejected, match="cannot be written as UTF-8"):
        apply_edits(tree, [Edit("agent/new.md", "", "bad \udc80 surrogate")])
    assert not (tree / "agent" / "new.md").exists()
    with pytest.raises(PatchRejected, match="does not parse"):
        apply_edits(tree, [Edit("agent/nul.py", "", "x = 1\x00")])
    with pytest.raises(PatchRejected, match="does not parse"):
        apply_edits(tree, [Edit("agent/deep.py", "", "x = " + "-" * 200_000 + "1")])


def test_allowed_paths_still_work(tree):
    written = apply_edits(
        tree,
        [
            Edit("agent/skills/a-b_c.1.md", "", "A skill."),
            Edit("agent/data.json", "", "{}"),
            Edit("agent/notes.txt", "", "n"),
            Edit("agent/agent.py", "Be nice.", "Be exact."),
        ],
    )
    assert sorted(written) == ["agent/agent.py", "agent/data.json", "agent/notes.txt", "agent/skills/a-b_c.1.md"]


def test_parse_proposal_raises_only_parse_errors_on_any_text():
    import random

    rng = random.Random(7)
    pieces = [
        "TITLE: t",
        "RATIONALE: r",
        "FILE: agent/x.py",
        "FILE:",
        "<<<<<<< SEARCH",
        "=======",
        ">>>>>>> REPLACE",
        "\x00",
        "\r\n",
        "\udc80",
        "**TITLE**:",
        ":",
        "",
        " ",
        "\u202e",
        "\x1b[2J",
    ]
    texts = ["", "\x00" * 10, "\n" * 1000, bytes(range(256)).decode("latin-1")]
    texts += ["\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    texts += ["".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(200)) for _ in range(200)]
    for text in texts:
        try:
            parse_proposal(text)
        except ParseError as exc:
            assert "\n" not in str(exc) and "\r" not in str(exc)
    with pytest.raises(ParseError):
        parse_proposal(None)
    with pytest.raises(ParseError):
        parse_proposal(b"TITLE: x")


def test_parsed_hostile_paths_reach_apply_as_refusals(tree):
    text = "TITLE: t\nFILE: agent/../../etc/x.py\n<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE\n"
    with pytest.raises(PatchRejected, match="only files under agent/"):
        apply_edits(tree, parse_proposal(text).edits)
    empty = parse_proposal("TITLE: t\nFILE:\n<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE\n")
    with pytest.raises(PatchRejected, match="empty"):
        apply_edits(tree, empty.edits)
