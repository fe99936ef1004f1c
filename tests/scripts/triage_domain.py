"""A test domain for task triage (tests/test_compare.py): six tasks any agent can pass, one no agent
can pass (its expected title is never the one the customer asks for), and one whose customer leaves
at once (EVOLVER_SCRIPT=tests.scripts.triage_domain:script). Import it as a plugin."""

from tau2.data_model.tasks import Task
from tau2.domains.mock.environment import get_environment
from tau2.registry import registry

from evolver.scripted import Reply, mock_script

DOMAIN = "evolver_triage"
QUIT = "You are in a hurry and leave at once."


def _task(task_id: str, asked: str, expected: str, extra: str = "") -> Task:
    return Task.model_validate(
        {
            "id": task_id,
            "user_scenario": {"instructions": f"{extra}You need a new task. Create a new task called '{asked}' for user_1."},
            "evaluation_criteria": {
                "actions": [{"action_id": "create", "name": "create_task", "arguments": {"user_id": "user_1", "title": expected}}],
                "reward_basis": ["DB"],
            },
        }
    )


TASKS = [_task(f"tri_{n}", f"Report {n}", f"Report {n}") for n in range(6)]
TASKS += [_task("tri_impossible", "Report 7", "Report seven"), _task("tri_quitter", "Report 8", "Report 8", QUIT + " ")]


def script(name, messages, tools):
    if name == "user" and QUIT in str(messages[0].get("content") or ""):
        return Reply("Sorry, no time. ###STOP###")
    return mock_script(name, messages, tools)


if DOMAIN not in registry.get_domains():
    registry.register_domain(get_environment, DOMAIN)
    registry.register_tasks(lambda task_split_name=None: list(TASKS), DOMAIN)
