"""A test domain of 48 generated tasks on tau2's mock environment, registered through tau2's registry.

Big enough (40 gate tasks) for the gate to accept a real improvement honestly,
with its default settings. Import it as a plugin: plugins = ["tests.scripts.gen_domain"].
"""

from tau2.data_model.tasks import Task
from tau2.domains.mock.environment import get_environment
from tau2.registry import registry

DOMAIN = "evolver_gen"
TITLES = ["Quarterly Report", "Team Offsite", "Budget Review", "Client Call", "Code Audit", "Launch Plan"]


def _task(n: int) -> Task:
    title = f"{TITLES[n % len(TITLES)]} {n}"
    return Task.model_validate(
        {
            "id": f"gen_{n:02d}",
            "user_scenario": {"instructions": f"You need a new task to track your work. Create a new task called '{title}' for user_1."},
            "evaluation_criteria": {
                "actions": [{"action_id": "create", "name": "create_task", "arguments": {"user_id": "user_1", "title": title}}],
                "reward_basis": ["DB"],
            },
        }
    )


TASKS = [_task(n) for n in range(48)]
SPLITS = {"train": [t.id for t in TASKS[:8]], "test": [t.id for t in TASKS[8:]]}


def get_tasks(task_split_name=None):
    if task_split_name is None:
        return list(TASKS)
    return [t for t in TASKS if t.id in SPLITS[task_split_name]]


if DOMAIN not in registry.get_domains():
    registry.register_domain(get_environment, DOMAIN)
    registry.register_tasks(get_tasks, DOMAIN, get_task_splits=lambda: SPLITS)
