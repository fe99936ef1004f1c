"""The planted-fault benchmark's domain: tasks on tau2's mock environment where the harness earns its keep.

With the scripted customer and agent of tests/scripts/planted.py, and H2 and H4 switched on (the layers
the planted faults live in), the template solves every task; without a layer, or without the turn
method (tau2's own LLMAgent then answers), the tasks that need that layer fail:

- plain:     create k tasks with the titles given.
- completed: the same, then "mark it as Completed": the agent copies the customer's word, which is
             not one of the tool's statuses; H2 repairs it to "completed".
- named:     "create ... named 'X'": the agent passes `name`, which the tool does not take; H2 sends
             the call back with the tool's arguments and the agent corrects it. Without H2 the tool fails.
- stuck:     the creations, then "mark task_N as completed" for a task that does not exist: the agent
             repeats the failing call; H4's stop rule ends the conversation with the creations made.
             Without it, tau2 ends it at its limit of 10 tool errors and scores it 0.

Every task creates tasks, 1 to 56 of them (a conversation of 6 to about 120 messages) with titles of 14
to 485 characters, so that a harness that cuts arguments or the history at a fixed length passes
some tasks and fails others. The lengths grow from split to split: the analysis split (train, 10 tasks)
goes up to 5 creations and 80 characters, the gate split (test, 40 tasks) to 27 and 246, and the
benchmark's own held-back split (holdout, 20 tasks, which `evolver run` never reads) to 56 and 485: a
window or a cut widened to what the gate shows still fails there.
"""

from tau2.data_model.tasks import Task
from tau2.domains.mock.environment import get_environment
from tau2.registry import registry

DOMAIN = "evolver_planted"
MAX_STEPS = 160  # the longest conversation (56 creations) takes about 120 steps; tau2's default is 100, evolver's 30
KINDS = ("plain", "completed", "plain", "named", "stuck")
CREATIONS = (1, 2, 3, 5, 8, 12, 18, 27, 40, 56)
TITLE_LENGTHS = (12, 18, 26, 38, 56, 80, 120, 170, 240, 340, 480)
# (split, tasks, how far up each ladder its tasks go)
SPLITS_SHAPE = (("train", 10, 4, 6), ("test", 40, 8, 9), ("holdout", 20, 10, 11))
WORDS = (
    "review the quarterly budget with finance and update the hiring plan for every regional office then "
    "collect vendor contracts check travel costs draft the annual audit checklist and schedule the offsite"
).split()


def title(length: int, start: int) -> str:
    """Words of WORDS from ``start`` on, until the title is at least ``length`` characters long."""
    words, n = [], start
    while len(" ".join(words)) < length:
        words.append(WORDS[n % len(WORDS)])
        n += 1
    text = " ".join(words)
    return text[0].upper() + text[1:]


def _task(split: str, i: int, creations: int, lengths: int, words_from: int) -> Task:
    kind = KINDS[i % len(KINDS)]
    k = CREATIONS[i % creations]
    longest = (i * 7) % lengths  # a stride coprime to the ladders: length and count vary independently
    titles = [title(TITLE_LENGTHS[longest - j % (longest + 1)], start=3 * j + i + words_from) for j in range(k)]
    quoted = ", ".join(f"'{t}'" for t in titles)
    verb = "named" if kind == "named" else "called"
    request = f"Please create {'a task' if k == 1 else f'{k} tasks'} for user_1 {verb} {quoted}"
    actions = [
        {"action_id": f"create_{j}", "name": "create_task", "arguments": {"user_id": "user_1", "title": t}} for j, t in enumerate(titles)
    ]
    if kind == "completed":
        request += ", then mark it as Completed"
        actions.append(
            {"action_id": "complete", "name": "update_task_status", "arguments": {"task_id": f"task_{k + 1}", "status": "completed"}}
        )  # the mock database holds task_1
    if kind == "stuck":
        request += ", then mark task_99 as completed"  # no such task: only the creations are expected
    return Task.model_validate(
        {
            "id": f"{split}_{i:02d}_{kind}_{k}",
            "user_scenario": {"instructions": f'You need tasks for your work. Ask for exactly this: "{request}."'},
            "evaluation_criteria": {"actions": actions, "reward_basis": ["DB"]},
        }
    )


SPLITS = {
    split: [_task(split, i, creations, lengths, words_from=7 * s) for i in range(n)]  # each split its own titles
    for s, (split, n, creations, lengths) in enumerate(SPLITS_SHAPE)
}
TASKS = [t for tasks in SPLITS.values() for t in tasks]


def get_tasks(task_split_name=None):
    return list(TASKS) if task_split_name is None else list(SPLITS[task_split_name])


if DOMAIN not in registry.get_domains():
    registry.register_domain(get_environment, DOMAIN)
    registry.register_tasks(get_tasks, DOMAIN, get_task_splits=lambda: {s: [t.id for t in ts] for s, ts in SPLITS.items()})
