"""gen_domain's tasks, nine of them: 3 to analyse, 6 to gate (3 with odd-numbered titles, which the loop
tests' scripted agent garbles until told to keep titles exact). For runs that must be quick, killed and
resumed. Import it as a plugin: plugins = ["tests.scripts.tiny_domain"]."""

from tau2.domains.mock.environment import get_environment
from tau2.registry import registry

from tests.scripts.gen_domain import TASKS

DOMAIN = "evolver_tiny"
SPLITS = {"train": [t.id for t in TASKS[:3]], "test": [t.id for t in TASKS[3:9]]}


def get_tasks(task_split_name=None):
    chosen = SPLITS[task_split_name] if task_split_name else SPLITS["train"] + SPLITS["test"]
    return [t for t in TASKS if t.id in chosen]


if DOMAIN not in registry.get_domains():
    registry.register_domain(get_environment, DOMAIN)
    registry.register_tasks(get_tasks, DOMAIN, get_task_splits=lambda: SPLITS)
