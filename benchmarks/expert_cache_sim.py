"""Reference points for an expert cache: Belady's optimal replacement (MIN) and LRU, simulated on a
recorded sequence of expert demands.

    python benchmarks/expert_cache_sim.py      # checks both against brute force on tiny sequences

What is simulated.  The demands are a list of groups, one per (token, layer) in the order the
forward pass meets them: (layer, experts, measured).  A group's experts are demanded together and
must all be resident together (a decode token's top-k of one layer); a prompt chunk's experts of a
layer are separate one-expert groups (the chunk is computed expert by expert, so only one need be
resident).  Each demanded expert not in a slot is one read into a slot (a miss); the cache has
`slots` slots, global (one pool, keyed by (layer, expert)) or per layer (slots // layers each).
A miss with the pool full evicts one resident expert not in the current group: MIN the one demanded
again farthest in the future (never again first), LRU the least recently demanded.  Hits and
misses are counted over the measured groups only (decode), the others (the prompt) warm the
cache.  MIN's count of reads is a lower bound for every policy, prefetching ones included: a
speculative read is a read.
"""
import heapq
import itertools
import random
from functools import lru_cache


def _flatten(groups, n_experts):
    """(keys, group index, measured) per demand, groups' experts in the order given."""
    keys, gid, measured = [], [], []
    for g, (layer, experts, m) in enumerate(groups):
        for e in experts:
            keys.append(layer * n_experts + e)
            gid.append(g)
            measured.append(m)
    return keys, gid, measured


def belady(groups, slots, n_experts):
    """(hits, misses) over the measured groups with Belady's MIN on one pool of `slots`."""
    keys, gid, measured = _flatten(groups, n_experts)
    n = len(keys)
    nxt, seen = [0] * n, {}   # position of the next demand of the same key; n: none
    for i in range(n - 1, -1, -1):
        nxt[i] = seen.get(keys[i], n)
        seen[keys[i]] = i
    resident, heap, group, hits, misses = {}, [], set(), 0, 0   # resident: key -> its next demand
    for i, k in enumerate(keys):
        if i == 0 or gid[i] != gid[i - 1]:
            group = set()
        if k in resident:
            hits += measured[i]
        else:
            misses += measured[i]
            if len(resident) >= slots:
                held = []
                while True:   # the farthest next demand, skipping stale entries and this group's
                    neg, victim = heapq.heappop(heap)
                    if resident.get(victim) != -neg:
                        continue
                    if victim in group:
                        held.append((neg, victim))
                        continue
                    break
                for item in held:
                    heapq.heappush(heap, item)
                del resident[victim]
        resident[k] = nxt[i]
        heapq.heappush(heap, (-nxt[i], k))
        group.add(k)
    return hits, misses


def lru(groups, slots, n_experts):
    """(hits, misses) over the measured groups with least-recently-used replacement."""
    from collections import OrderedDict
    cache, hits, misses = OrderedDict(), 0, 0
    for layer, experts, m in groups:
        group = {layer * n_experts + e for e in experts}
        for e in experts:
            k = layer * n_experts + e
            if k in cache:
                hits += m
                cache.move_to_end(k)
                continue
            misses += m
            if len(cache) >= slots:
                victim = next(v for v in cache if v not in group)
                del cache[victim]
            cache[k] = True
    return hits, misses


def per_layer(policy, groups, slots, n_experts, n_layers):
    """`policy` with slots // n_layers slots for each layer's own pool."""
    hits = misses = 0
    for layer in range(n_layers):
        h, m = policy([g for g in groups if g[0] == layer], slots // n_layers, n_experts)
        hits, misses = hits + h, misses + m
    return hits, misses


# ---- the check ----------------------------------------------------------------------------------

def brute_force(groups, slots, n_experts):
    """The fewest measured misses any replacement achieves (every choice of victim tried)."""
    keys, gid, measured = _flatten(groups, n_experts)

    @lru_cache(maxsize=None)
    def best(i, cache):
        if i == len(keys):
            return 0
        k = keys[i]
        if k in cache:
            return best(i + 1, cache)
        cost = measured[i]
        if len(cache) < slots:
            return cost + best(i + 1, cache | {k})
        group = {keys[j] for j in range(i) if gid[j] == gid[i]}
        return cost + min(best(i + 1, (cache - {v}) | {k}) for v in cache if v not in group)

    total = sum(measured)
    return total - best(0, frozenset()), best(0, frozenset())


def _random_groups(rng, n_layers, n_experts, top_k, tokens):
    groups = [(l, sorted(rng.sample(range(n_experts), top_k)), False) for l in range(n_layers)]
    for _ in range(tokens):
        for l in range(n_layers):
            weights = [1.0 / (1 + e) for e in range(n_experts)]   # skewed, as the bench model's
            chosen = set()
            while len(chosen) < top_k:
                chosen.add(rng.choices(range(n_experts), weights)[0])
            groups.append((l, sorted(chosen), True))
    return groups


def check(trials=300, seed=0):
    """MIN equals brute force and LRU never beats it, on small random sequences."""
    rng = random.Random(seed)
    for t in range(trials):
        n_layers, n_experts, top_k = rng.choice([(1, 4, 1), (1, 5, 2), (2, 3, 2), (2, 4, 1), (1, 6, 3)])
        groups = _random_groups(rng, n_layers, n_experts, top_k, rng.randint(2, 5))
        for slots in range(top_k, min(n_layers * n_experts, top_k + 3) + 1):
            want = brute_force(groups, slots, n_experts)
            got = belady(groups, slots, n_experts)
            assert got == want, (t, groups, slots, got, want)
            assert lru(groups, slots, n_experts)[0] <= want[0], (t, groups, slots)
    # a known case: cyclic access over slots + 1 keys, where LRU misses always and MIN once per slot
    cyc = [(0, [e], True) for e in itertools.islice(itertools.cycle(range(4)), 40)]
    assert lru(cyc, 3, 4) == (0, 40)
    assert belady(cyc, 3, 4)[0] > 0
    return trials


if __name__ == "__main__":
    print(f"MIN matches brute force, LRU never above it: {check()} random sequences")
