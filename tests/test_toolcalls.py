"""evolver.toolcalls: tool calls written as text become structured calls; real text stays."""

from __future__ import annotations

import pytest

from evolver.toolcalls import parse_text_tool_calls

TOOLS = ["create_task", "get_users", "update_task_status", "transfer_to_human_agents"]
CREATE = {"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}
CREATE_JSON = '{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}'


@pytest.mark.parametrize(
    "text",
    [
        CREATE_JSON,
        f"  {CREATE_JSON}\n",
        f"```json\n{CREATE_JSON}\n```",
        f"```\n{CREATE_JSON}\n```",
        f"<tool_call>\n{CREATE_JSON}\n</tool_call>",
        f"<tool_call>\n{CREATE_JSON}",  # the model stopped before closing the tag
        f"<tool_call>\n```json\n{CREATE_JSON}\n```\n</tool_call>",
        f"[{CREATE_JSON}]",
        '{"name": "create_task", "parameters": {"user_id": "user_1", "title": "Important Meeting"}}',
        '{"name": "create_task", "arguments": "{\\"user_id\\": \\"user_1\\", \\"title\\": \\"Important Meeting\\"}"}',
        '{"type": "function", "function": {"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}}',
        "{" + CREATE_JSON + "}",  # doubled braces, as a Jinja-escaped template example teaches
        '{{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}}',
    ],
)
def test_one_call_in_any_of_the_written_forms(text):
    calls, rest = parse_text_tool_calls(text, TOOLS)
    assert calls == [CREATE]
    assert rest is None


def test_several_calls_in_tags_and_lists():
    two = '{"name": "get_users", "arguments": {}}'
    for text in (
        f"<tool_call>{CREATE_JSON}</tool_call>\n<tool_call>{two}</tool_call>",
        f"[{CREATE_JSON}, {two}]",
        f"```json\n{CREATE_JSON}\n```\n```json\n{two}\n```",
    ):
        calls, rest = parse_text_tool_calls(text, TOOLS)
        assert [c["name"] for c in calls] == ["create_task", "get_users"]
        assert rest is None


def test_text_around_a_call_is_kept():
    calls, rest = parse_text_tool_calls(f"Sure, I will create it now.\n```json\n{CREATE_JSON}\n```\nDone soon.", TOOLS)
    assert calls == [CREATE]
    assert rest == "Sure, I will create it now.\n\nDone soon."


@pytest.mark.parametrize(
    "text",
    [
        "Hello! How can I help you with your tasks today?",
        "Your task {task_1} is pending.",
        'The user record is {"user_id": "user_1", "name": "Alice"}.',
        '```json\n{"status": "completed"}\n```',
        "```python\nprint('hi')\n```",
        "Use braces like { and [ freely; they are not calls.",
        "[1, 2, 3]",
    ],
)
def test_genuine_text_is_never_taken(text):
    calls, rest = parse_text_tool_calls(text, TOOLS)
    assert calls == []
    assert rest == text.strip()


def test_unknown_tool_names_stay_text_when_names_are_given():
    text = '{"name": "delete_tasks", "arguments": {"user_id": "user_1"}}'
    assert parse_text_tool_calls(text, TOOLS) == ([], text)
    # Without a list of names, any call shape counts.
    assert parse_text_tool_calls(text) == ([{"name": "delete_tasks", "arguments": {"user_id": "user_1"}}], None)


def test_a_list_with_one_unknown_call_is_text():
    text = f'[{CREATE_JSON}, {{"name": "delete_tasks", "arguments": {{}}}}]'
    calls, rest = parse_text_tool_calls(text, TOOLS)
    assert calls == [] and rest == text


def test_name_alone_counts_only_for_a_known_tool():
    assert parse_text_tool_calls('{"name": "get_users"}', TOOLS) == ([{"name": "get_users", "arguments": {}}], None)
    assert parse_text_tool_calls('{"name": "Alice"}', TOOLS) == ([], '{"name": "Alice"}')
    assert parse_text_tool_calls('{"name": "get_users"}') == ([], '{"name": "get_users"}')


def test_bad_arguments_are_not_a_call():
    for text in ('{"name": "create_task", "arguments": "not json"}', '{"name": "create_task", "arguments": [1]}'):
        assert parse_text_tool_calls(text, TOOLS) == ([], text)


def test_empty_and_none():
    assert parse_text_tool_calls(None) == ([], None)
    assert parse_text_tool_calls("") == ([], None)
    assert parse_text_tool_calls("   \n") == ([], None)


def test_broken_json_is_left_as_text():
    text = '<tool_call>\n{"name": "create_task", "arguments": {"user_id": "user_1"\n</tool_call>'
    calls, rest = parse_text_tool_calls(text, TOOLS)
    assert calls == [] and rest == text


def test_tool_names_may_be_any_iterable():
    calls, _ = parse_text_tool_calls(CREATE_JSON, (n for n in TOOLS))
    assert calls == [CREATE]
