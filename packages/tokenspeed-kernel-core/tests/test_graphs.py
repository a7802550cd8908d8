"""``tokenspeed_kernel.graphs.GraphCache`` on CPU: when it is used, and its replay bookkeeping.

The capture itself needs CUDA; here ``_capture`` is replaced by one that records a fake
graph whose replay runs the function on the static inputs (what a CUDA graph replays),
so the copy-in, the replay, the output clone and the eviction are checked. The GPU tests
of the MoE wrappers (nvidia package) compare real replays with the direct path bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from tokenspeed_kernel import graphs as G


class _FakeGraph:
    def __init__(self, fn, inputs, output):
        self.fn, self.inputs, self.output, self.replays = fn, inputs, output, 0

    def replay(self):
        self.replays += 1
        self.output.copy_(self.fn(*self.inputs))


def _fake_capture(cache):
    def capture(key, inputs, fn, *, copy_inputs, keep_output=True):
        # In place, the fake replays on the caller's tensor objects: what a graph reading their addresses sees.
        static = tuple(t.clone() for t in inputs) if copy_inputs else tuple(inputs)
        out = fn(*static)
        entry = G._Graph(_FakeGraph(fn, static, out), static if copy_inputs else (), out if keep_output else None)
        cache._graphs[key] = entry
        cache.captures += 1
        return entry

    return capture


def test_not_used_on_cpu_inside_no_eager_graphs_or_for_subclasses():
    cache = G.GraphCache("t")
    x = torch.ones(3)
    assert not cache.usable(x)  # CPU: the direct call
    with G.no_eager_graphs():
        assert not cache.usable(x)
    assert not cache.usable(torch.nn.Parameter(torch.ones(2)))


def test_replay_copies_the_inputs_in_and_clones_the_output(monkeypatch):
    cache = G.GraphCache("t", max_graphs=2)
    monkeypatch.setattr(cache, "_capture", _fake_capture(cache))
    calls = []

    def fn(a, b):
        calls.append(a.data_ptr())
        return a * 2 + b

    a, b = torch.arange(4.0), torch.ones(4)
    key = (G.tensor_key(a), G.tensor_key(b))
    direct = cache.run(key, (a, b), fn)  # first sighting: the direct call, no capture
    assert cache.captures == 0 and torch.equal(direct, fn(a, b)) and calls[0] == a.data_ptr()
    first = cache.run(key, (a, b), fn)  # second: captured, then replayed
    assert torch.equal(first, fn(a, b)) and cache.captures == 1
    a2 = torch.arange(4.0) * 10  # new values, same shape: a replay of the captured graph
    second = cache.run(key, (a2, b), fn)
    assert cache.captures == 1 and cache._graphs[key].graph.replays == 2
    assert torch.equal(second, fn(a2, b))
    assert not torch.equal(first, second)  # the first result was a clone, not the graph's buffer


def test_in_place_replays_read_the_inputs_where_they_are_and_other_addresses_take_the_copying_graph(monkeypatch):
    cache = G.GraphCache("t", max_graphs=4)
    monkeypatch.setattr(cache, "_capture", _fake_capture(cache))

    def fn(a, b):
        return a * 2 + b

    a, b = torch.arange(4.0), torch.ones(4)
    key = (G.tensor_key(a), G.tensor_key(b))
    assert torch.equal(cache.run(key, (a, b), fn, in_place=True), fn(a, b))  # first sighting: direct
    assert cache.captures == 0
    assert torch.equal(cache.run(key, (a, b), fn, in_place=True), fn(a, b))  # same addresses: captured in place
    place = (key, (a.data_ptr(), b.data_ptr()))
    assert cache.captures == 1 and key not in cache._graphs and cache._graphs[place].inputs == ()
    a.mul_(10)  # new values at the same address: the in-place graph replays them
    first = cache.run(key, (a, b), fn, in_place=True)
    assert torch.equal(first, fn(a, b)) and cache._graphs[place].graph.replays == 2 and cache.captures == 1
    a2 = torch.arange(4.0) + 7  # same shape, another address: not the in-place graph's call
    second = cache.run(key, (a2, b), fn, in_place=True)  # the key's second sighting: the copying graph
    assert torch.equal(second, fn(a2, b)) and cache.captures == 2 and len(cache._graphs[key].inputs) == 2
    assert cache._graphs[place].graph.replays == 2
    assert torch.equal(first, fn(a, b))  # results are clones, not the graphs' buffers
    assert torch.equal(cache.run(key, (torch.zeros(4), b), fn, in_place=True), b)  # copying graph again
    assert cache.captures == 2
    assert cache.stats() == {
        "graphs": 2, "in_place_graphs": 1, "captures": 2, "in_place_replays": 2, "copying_replays": 2,
        "direct_calls": 1, "evictions": 0,
    }  # fmt: skip


def test_in_place_graphs_with_a_new_output_write_it_where_it_is(monkeypatch):
    """``new_output``: the in-place graph is keyed by the output's address too, writes that tensor (the fake replay
    writes the captured output object, as a graph writes its address) and returns it without a clone; the entry holds
    no reference to it; the direct and copying paths fill the new output too."""
    cache = G.GraphCache("t", max_graphs=4)
    monkeypatch.setattr(cache, "_capture", _fake_capture(cache))

    def fn(a, b, out=None):
        return torch.add(a * 2, b, out=out)

    a, b = torch.arange(4.0), torch.ones(4)
    key = (G.tensor_key(a), G.tensor_key(b))
    buf = torch.empty(4)  # the "allocator's" block: the same address call after call
    made = []

    def new_output():
        made.append(1)
        return buf

    first = cache.run(key, (a, b), fn, in_place=True, new_output=new_output)  # direct, into the new output
    assert first is buf and torch.equal(buf, fn(a, b)) and cache.captures == 0
    buf.zero_()
    second = cache.run(key, (a, b), fn, in_place=True, new_output=new_output)  # captured in place, then replayed
    place = (key, (a.data_ptr(), b.data_ptr(), buf.data_ptr()))
    assert second is buf and torch.equal(buf, fn(a, b)) and cache.captures == 1
    assert cache._graphs[place].output is None and cache._graphs[place].inputs == ()
    a.mul_(3)
    buf.zero_()
    assert cache.run(key, (a, b), fn, in_place=True, new_output=new_output) is buf  # a replay: no clone
    assert torch.equal(buf, fn(a, b)) and cache._graphs[place].graph.replays == 2 and len(made) == 3
    other = torch.empty(4)  # an output at another address: not that graph's call; the copying graph fills it
    for _ in range(2):
        got = cache.run(key, (a, b), fn, in_place=True, new_output=lambda: other)
        assert got is other and torch.equal(other, fn(a, b))
    assert key in cache._graphs and cache.captures == 3


def test_in_place_graphs_have_their_own_budget_and_at_most_two_address_sets_a_key(monkeypatch):
    cache = G.GraphCache("t", max_graphs=2)
    monkeypatch.setattr(cache, "_capture", _fake_capture(cache))
    b = torch.ones(3)
    held = [torch.full((3,), float(i)) for i in range(3)]  # three address sets of one key, kept alive
    key = (G.tensor_key(held[0]), G.tensor_key(b))
    for a in held:
        for _ in range(3):
            assert torch.equal(cache.run(key, (a, b), torch.add, in_place=True), a + b)
    assert len(cache._places[key]) == G.PLACES_PER_KEY == 2  # the third set takes the copying graph
    assert key in cache._graphs and len(cache) == 3 and cache.captures == 3
    # Two in-place graphs fill their budget, not the copying graphs': a new shape still gets one.
    c = torch.ones(5)
    for _ in range(3):
        assert torch.equal(cache.run("other", (c,), torch.neg, in_place=True), -c)
    assert "other" in cache._graphs and cache.captures == 4


def test_a_stale_in_place_graph_gives_its_place_to_an_address_set_that_recurs(monkeypatch):
    """The first calls of a loop (warm-up) may fill a key's places with address sets that never come back; once one
    has not been replayed for STALE_CALLS calls of its key, a set seen twice since takes its place (and replays in
    place from then on). A set that keeps changing never does: it is never seen twice."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"synchronize": lambda self: None})())
    cache = G.GraphCache("t", max_graphs=8)
    monkeypatch.setattr(cache, "_capture", _fake_capture(cache))
    b = torch.ones(3)
    warm = [torch.full((3,), float(i)) for i in range(2)]
    key = (G.tensor_key(warm[0]), G.tensor_key(b))
    for a in warm:  # warm-up: two address sets, each seen twice, fill the key's places
        for _ in range(2):
            cache.run(key, (a, b), torch.add, in_place=True)
    assert len(cache._places[key]) == 2 and cache.evictions == 0
    steady = torch.full((3,), 7.0)
    for _ in range(G.STALE_CALLS + 4):
        assert torch.equal(cache.run(key, (steady, b), torch.add, in_place=True), steady + b)
    st = cache.stats()
    assert cache.evictions == 1 and (key, (steady.data_ptr(), b.data_ptr())) in cache._graphs
    assert st["in_place_replays"] >= 3 and len(cache._places[key]) == 2
    # a set that changes on every call is never seen twice: copying replays only, nothing evicted
    before = cache.stats()
    kept = [torch.full((3,), 1.0) for _ in range(3 * G.STALE_CALLS)]  # alive: each at its own address
    for fresh in kept:
        assert torch.equal(cache.run(key, (fresh, b), torch.add, in_place=True), fresh + b)
    after = cache.stats()
    assert after["evictions"] == before["evictions"] and after["in_place_replays"] == before["in_place_replays"]
    assert after["copying_replays"] == before["copying_replays"] + len(kept)


def test_a_full_cache_runs_new_keys_directly_and_keeps_its_graphs(monkeypatch):
    cache = G.GraphCache("t", max_graphs=2)
    monkeypatch.setattr(cache, "_capture", _fake_capture(cache))
    a = torch.ones(3)
    for key in ("k1", "k2", "k3"):
        for _ in range(3):
            assert torch.equal(cache.run(key, (a,), lambda x: x + 1), a + 1)
    assert sorted(cache._graphs) == ["k1", "k2"] and cache.captures == 2  # k3 never evicts them


def test_a_failed_capture_warns_once_and_the_key_runs_directly(monkeypatch):
    cache = G.GraphCache("t")
    tries = []

    def failing(key, inputs, fn, *, copy_inputs, keep_output=True):
        tries.append(key)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cache, "_capture", failing)
    a = torch.ones(2)
    assert torch.equal(cache.run("k", (a,), lambda x: x * 3), a * 3)  # first sighting: direct
    with pytest.warns(RuntimeWarning, match="capture failed"):
        assert torch.equal(cache.run("k", (a,), lambda x: x * 3), a * 3)
    assert torch.equal(cache.run("k", (a,), lambda x: x * 3), a * 3)
    assert tries == ["k"] and len(cache) == 0


def test_tensor_key_tells_layouts_apart():
    x = torch.zeros(4, 6)
    assert G.tensor_key(x) != G.tensor_key(x.t())
    assert G.tensor_key(x) != G.tensor_key(x.to(torch.float16))
    assert G.tensor_key(x) == G.tensor_key(torch.ones(4, 6))


def test_in_place_key_tells_weights_apart_by_address_and_layout():
    w = torch.zeros(4, 6)
    assert G.in_place_key(w, None) == G.in_place_key(w, None)
    assert G.in_place_key(w) != G.in_place_key(w.clone())  # another address: another graph
    assert G.in_place_key(w) != G.in_place_key(w.view(6, 4))  # same address, other shape
    assert G.in_place_key(w) != G.in_place_key(w.view(torch.int32))  # same address, other dtype
    assert G.in_place_key(None) == (None,)
