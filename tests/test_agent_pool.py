"""Agent processes started ahead of their simulations (proxy_agent.AgentPool), with the real
zygote and sandbox: they are ready before they are needed, each serves one simulation, none is
started once every simulation has its own, and the ones left over are killed."""

from __future__ import annotations

import time

import pytest

from evolver.data import RoleModel
from evolver.evaluation import proxy_agent, zygote_client
from evolver.evaluation.worker.candidate import stage_candidate


class CountingFactory:
    """The worker's connection to the zygote, counting the agent processes it starts."""

    def __init__(self):
        self.inner = zygote_client.WorkerConnection(zygote_client.connect().sock.detach())
        self.spawned: list[int] = []

    def spawn_agent(self, spec, fd):
        pid = self.inner.spawn_agent(spec, fd)
        self.spawned.append(pid)
        return pid

    def exit_code(self, pid, timeout):
        return self.inner.exit_code(pid, timeout)


@pytest.fixture
def settings(repo, tmp_path):
    return proxy_agent.Settings(
        role=RoleModel(model="scripted/agent"),
        source=stage_candidate(repo, tmp_path),
        scratch_root=tmp_path,
        sandbox=True,
        limits={"memory_mb": 1024},
        turn_timeout=60,
        completion=None,
        factory=CountingFactory(),
    )


def wait_for(condition, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def test_processes_are_started_ahead_each_serves_one_simulation_and_none_is_wasted(settings):
    waiting = [5]  # simulations not started yet
    pool = proxy_agent.AgentPool(settings, lambda: min(2, waiting[0]))
    factory = settings.factory
    assert wait_for(lambda: len(factory.spawned) == 2)  # before any simulation asked
    time.sleep(0.3)
    assert len(factory.spawned) == 2  # no more than want() at a time
    contexts, pids = [], []
    try:
        for _ in range(5):
            waiting[0] -= 1  # the worker claims a simulation, then its agent starts
            context = proxy_agent.SimContext()
            contexts.append(context)
            process = pool.take(context)
            assert process.isolation["mode"] == "sandbox" and context.processes == [process]
            pids.append(process.pid)
        time.sleep(0.5)  # the refill thread has seen want() fall to 0
    finally:
        pool.close()
        for context in contexts:
            context.close()
    assert len(set(pids)) == 5
    assert sorted(factory.spawned) == sorted(pids)  # every process started served a simulation


def test_spares_left_when_the_evaluation_ends_are_killed(settings):
    pool = proxy_agent.AgentPool(settings, lambda: 3)
    factory = settings.factory
    assert wait_for(lambda: len(factory.spawned) == 3)
    spares = list(factory.spawned)
    pool.close()
    assert all(factory.exit_code(pid, 10) is not None for pid in spares)


def test_the_process_that_checked_the_import_serves_the_first_simulation(settings):
    checked = proxy_agent.AgentProcess(settings).attach(proxy_agent.SimContext())  # the worker's import check
    pool = proxy_agent.AgentPool(settings, lambda: 0, ready=(checked,))
    context = proxy_agent.SimContext()
    try:
        assert pool.take(context) is checked and context.processes == [checked]
        assert settings.factory.spawned == [checked.pid]  # no second process was started for it
    finally:
        pool.close()
        context.close()


class FailingOnce(CountingFactory):
    """A zygote that refuses the first agent process, as under a passing memory shortage."""

    def spawn_agent(self, spec, fd):
        if not hasattr(self, "refused"):
            self.refused = True
            raise OSError("cannot allocate memory")
        return super().spawn_agent(spec, fd)


def test_a_process_that_fails_to_start_does_not_end_prestarting(settings):
    settings.factory = FailingOnce()
    pool = proxy_agent.AgentPool(settings, lambda: 1)
    try:
        assert wait_for(lambda: len(settings.factory.spawned) == 1, timeout=20)  # tried again after a pause
        assert pool.failures == 1
    finally:
        pool.close()
