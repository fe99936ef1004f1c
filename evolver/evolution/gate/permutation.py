"""The permutation engine: p-values of a staged procedure by relabelling trials within blocks.

What a block is, why relabelling within blocks keeps the test exact and how
the earlier looks enter the p-value: docs/gate.md ("The final test") and the
docstrings below. The engine knows no configs and no verdicts: the set gate
(set_gate.py) builds the blocks, names the futility boundaries and reads the
p-values.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

RewardTable = Mapping[str, Sequence[float | None]]  # task id -> rewards per trial; None: an infrastructure error

# Per-task weights 1/k + 1/m are exact integers on a grid of lcm(trial counts)
# when that is at most 120 (any mix of 1-6 and 8 trials). Otherwise they are
# rounded to this grid: the test stays exact, since the weights do not depend
# on outcomes, and each weight moves by under 3% up to 12 trials a side; a
# finer grid makes the exact computation take seconds.
_MAX_GRID = 120
TINY = 1e-12  # an effect or stderr this small is rounding error: 0

# A block is a set of trials of one task that relabelling may exchange: (candidate values, the look
# at which each is first seen, incumbent values, the looks at which they count). A block with no
# candidate value never changes: it holds fixed results the looks compare against.
Block = tuple[list[float], tuple[int, ...], list[float], tuple[int, ...]]


def concurrent_blocks(
    incumbent: RewardTable, candidate: RewardTable, stages: tuple[int, ...], reference: RewardTable | None = None
) -> dict[str, list[Block]]:
    """Per task, one block per stage: the valid trials both sides ran in that stage's window.

    Only trials of the same window are exchanged, so a drift between windows
    moves both sides of every block alike and cannot pass for an effect. The
    reference's trials, if any, are a fixed block that only the looks before
    the last count.
    """
    last = len(stages) - 1
    blocks = {}
    for task in sorted(candidate.keys() & incumbent.keys()):
        task_blocks = []
        for look, (low, high) in enumerate(zip((0, *stages), stages)):
            cand = [float(r) for r in candidate[task][low:high] if r is not None]
            inc = [float(r) for r in incumbent[task][low:high] if r is not None]
            if cand or inc:
                task_blocks.append((cand, (look,) * len(cand), inc, tuple(range(look, last + 1))))
        if any(b[0] for b in task_blocks) and any(b[2] for b in task_blocks):
            earlier = [float(r) for r in (reference or {}).get(task, ()) if r is not None]
            blocks[task] = task_blocks + ([([], (), earlier, tuple(range(last)))] if earlier and last else [])
    return blocks


def staged_p_value(
    blocks: dict[str, list[Block]], futility: tuple[float, ...], permutations: int, alpha: float
) -> tuple[float, int | None]:
    """Monte-Carlo relabelling of the whole staged procedure, seeded by the data.

    Under "no effect", the valid candidate and incumbent trials of a block are
    exchangeable, so each relabelling shuffles them: the candidate's slots, in
    trial order, take the first values, the incumbent the rest. Each
    relabelling is put through every earlier look (the same z as the set gate's
    looks, z_score, against ``futility[look]``, over the trials seen by then)
    and the final total delta; ``permutations`` relabellings at most, and
    ``alpha`` only to stop drawing early. Returns the p-value and the earlier
    look that stops the observed results (then the p-value is 1), or None.
    (hits + 1) / (draws + 1) is a valid p-value at any number of draws.
    Drawing stops early once the hits rule out p <= alpha, so a clear reject
    costs less and gets the same decision.
    """
    looks = len(futility) + 1
    groups: dict[tuple, list[list[list[float]]]] = {}  # block shapes -> per task, the pooled trials of each block
    for task in sorted(blocks):
        shape = tuple((len(c), seen, len(i), at) for c, seen, i, at in blocks[task])
        groups.setdefault(shape, []).append([c + i for c, _, i, _ in blocks[task]])
    seed = hashlib.sha256(repr(sorted(groups.items())).encode()).digest()[:8]
    rng = np.random.default_rng(int.from_bytes(seed))
    pooled = {shape: [np.array([task[b] for task in tasks]) for b in range(len(shape))] for shape, tasks in sorted(groups.items())}

    def relabelled(draws: int) -> list[list]:
        """Per look, the (draws, tasks) deltas of `draws` relabellings, one array per group."""
        deltas: list[list] = [[] for _ in range(looks)]
        for shape, arrays in pooled.items():
            drawn = [_relabel(rng, array, k, draws) for (k, *_), array in zip(shape, arrays)]
            _add_deltas(deltas, shape, drawn)
        return deltas

    observed: list[list] = [[] for _ in range(looks)]
    for shape, arrays in pooled.items():
        seen = [(list(np.cumsum(a[:, :k], axis=1).T[:, None, :]), a[:, k:].sum(axis=1)[None, :]) for (k, *_), a in zip(shape, arrays)]
        _add_deltas(observed, shape, seen)
    stop, total = _judge(observed, futility)
    if stop[0] < looks - 1:
        return 1.0, int(stop[0])
    hits = drawn = 0
    while drawn < permutations:
        draws = min(1000, permutations - drawn)
        stops, totals = _judge(relabelled(draws), futility)
        # float sums of the same values may differ in the last bit
        hits += int(np.count_nonzero((stops == looks - 1) & (totals >= total[0] - 1e-9)))
        drawn += draws
        if hits + 1 > alpha * (permutations + 1):
            break  # p > alpha whatever the remaining draws give
    return (hits + 1) / (drawn + 1), None


def _relabel(rng: np.random.Generator, pooled, k: int, draws: int) -> tuple[list, object]:
    """`draws` relabellings of one block of a group of tasks (pooled: tasks x trials, the candidate's k first).

    Returns the candidate's running totals over its first 1..k slots and the
    incumbent's total, each (draws, tasks).
    """
    if np.isin(pooled, (0.0, 1.0)).all():  # draw the candidate's trials one by one: fast
        ones = np.broadcast_to(pooled.sum(axis=1).astype(np.int16), (draws, len(pooled))).copy()
        running, sums = np.zeros_like(ones), []
        for j in range(k):
            took = rng.integers(0, pooled.shape[1] - j, size=ones.shape, dtype=np.int16) < ones
            ones -= took
            running += took
            sums.append(running.copy())
        return sums, ones
    shuffled = rng.permuted(np.broadcast_to(pooled, (draws, *pooled.shape)), axis=2)
    return list(np.moveaxis(np.cumsum(shuffled[..., :k], axis=2), 2, 0)), shuffled[..., k:].sum(axis=2)


def _add_deltas(deltas: list[list], shape: tuple, blocks: list[tuple[list, object]]) -> None:
    """Append one group's per-task deltas at each look; blocks[b] = (candidate's running totals, incumbent's total)."""
    for look in range(len(deltas)):
        cand_sum = inc_sum = 0
        cand_n = inc_n = 0
        for (_, seen, m, at), (sums, inc_total) in zip(shape, blocks):
            count = sum(s <= look for s in seen)
            if count:
                cand_sum, cand_n = cand_sum + sums[count - 1], cand_n + count
            if m and look in at:
                inc_sum, inc_n = inc_sum + inc_total, inc_n + m
        if cand_n and inc_n:  # a task with no valid trial yet on a side sits the look out
            deltas[look].append(cand_sum / cand_n - inc_sum / inc_n)


def _judge(deltas: list[list], futility: tuple[float, ...]) -> tuple:
    """For each row: the first look whose z falls below its futility boundary (len(futility) if none), and the final total delta."""
    rows = deltas[-1][0].shape[0]
    stop = np.full(rows, len(futility))
    for look, boundary in enumerate(futility):
        if sum(d.shape[1] for d in deltas[look]) >= 2:  # as the looks: z needs two tasks
            values = np.concatenate(deltas[look], axis=1)
            effect = values.mean(axis=1)
            stderr = values.std(axis=1, ddof=1) / math.sqrt(values.shape[1])
            flat = np.where(effect > TINY, np.inf, np.where(effect < -TINY, -np.inf, 0.0))  # as z_score()
            z = np.where(stderr > TINY, effect / np.maximum(stderr, TINY), flat)
            stop = np.where((stop == len(futility)) & (z < boundary), look, stop)
    return stop, np.concatenate(deltas[-1], axis=1).sum(axis=1)


def exact_p_value(pairs: list[tuple[list[float], list[float]]]) -> float:
    """P(relabelled total delta >= observed), exact, for 0/1 rewards.

    Per task with k candidate and m incumbent trials and s successes in all,
    delta = X (1/k + 1/m) - s/m where X, the candidate's successes, is
    hypergeometric under relabelling. So the total delta is sum(w X) plus a
    constant, with integer weights w proportional to 1/k + 1/m. Its exact
    distribution is the product of one counting polynomial per task; Python's
    big integers multiply those fast when each coefficient is packed into a
    B-bit digit (Kronecker substitution).
    """
    counts = [n for c, i in pairs for n in (len(c), len(i))]
    grid = math.lcm(*counts)
    grid = grid if grid <= _MAX_GRID else _MAX_GRID
    tasks = []  # (weight, pooled trials, pooled successes, candidate trials, observed X)
    for cand, inc in pairs:
        k, n, s = len(cand), len(cand) + len(inc), int(sum(cand) + sum(inc))
        if 0 < s < n:  # a task with all-equal trials cannot change under relabelling
            tasks.append((round(grid * (1 / k + 1 / len(inc))), n, s, k, int(sum(cand))))
    if not tasks:
        return 1.0
    unit = math.gcd(*(w for w, *_ in tasks))
    total = math.prod(math.comb(n, k) for _, n, _, k, _ in tasks)
    bits = total.bit_length() + 1  # every coefficient and every tail sum fits
    product = 1
    for (w, n, s, k), repeat in Counter(t[:4] for t in tasks).items():
        step = bits * (w // unit)
        poly = sum(math.comb(s, x) * math.comb(n - s, k - x) << (step * x) for x in range(max(0, k - (n - s)), min(k, s) + 1))
        product *= poly**repeat
    observed = sum(w // unit * x for w, _, _, _, x in tasks)
    # Digits of base 2**bits sum to the number modulo 2**bits - 1, as digits of
    # base 10 do modulo 9; no carries since the sum is below the modulus.
    tail = (product >> (bits * observed)) % ((1 << bits) - 1)
    return tail / total


def z_score(effect: float, stderr: float | None) -> float | None:
    """effect / stderr, the statistic of the futility looks; None without a stderr."""
    if stderr is None:
        return None
    if stderr <= TINY:  # every task moved by the same amount
        return math.copysign(math.inf, effect) if abs(effect) > TINY else 0.0
    return effect / stderr


def t_quantile(q: float, df: int) -> float:
    """Student t quantile by the Cornish-Fisher expansion (within 0.5% for df >= 5)."""
    z = NormalDist().inv_cdf(q)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def p_text(p_value: float) -> str:
    return "p<0.001" if p_value < 0.001 else f"p={p_value:.3f}"
