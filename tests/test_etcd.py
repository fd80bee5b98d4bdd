"""colibri.remote.etcd against real etcd members on loopback: keys, compare-and-swap, leases,
watches across a killed member, and etcd's election."""
import threading
import time

import pytest

from colibri.remote.etcd import Etcd, EtcdError, LeaseExpired, parse_endpoints

from etcd_cluster import ETCD, MISSING, EtcdCluster, free_ports

pytestmark = [pytest.mark.skipif(ETCD is None, reason=MISSING), pytest.mark.xdist_group("etcd")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), members=3) as c:
        yield c


def test_keys_and_compare_and_swap(cluster):
    store = Etcd(cluster.endpoints)
    rev = store.put("/t/cas/a", b"1")
    kv = store.get("/t/cas/a")
    assert kv["value"] == b"1" and kv["mod_revision"] == rev
    assert store.create("/t/cas/b", b"first") and not store.create("/t/cas/b", b"second")
    assert store.get("/t/cas/b")["value"] == b"first"
    # a write conditioned on the revision read: the second writer with the same stale revision loses
    ok1, _ = store.txn([store.compare_mod("/t/cas/a", rev)], [store.put_op("/t/cas/a", b"2")])
    ok2, _ = store.txn([store.compare_mod("/t/cas/a", rev)], [store.put_op("/t/cas/a", b"3")])
    assert (ok1, ok2) == (True, False) and store.get("/t/cas/a")["value"] == b"2"
    kvs, _ = store.get_prefix("/t/cas/")
    assert [k["key"] for k in kvs] == [b"/t/cas/a", b"/t/cas/b"]


def test_lease_binds_a_key_to_its_holder(cluster):
    store = Etcd(cluster.endpoints)
    kept, dropped = store.grant(2), store.grant(2)
    store.put("/t/lease/kept", b"x", lease=kept)
    store.put("/t/lease/dropped", b"x", lease=dropped)
    deadline = time.monotonic() + 10
    while store.get("/t/lease/dropped") is not None:   # etcd expires it within a TTL plus its check period
        assert time.monotonic() < deadline, "a key of an expired lease stayed"
        store.keepalive(kept)
        time.sleep(0.3)
    assert store.get("/t/lease/kept")["lease"] == kept
    with pytest.raises(LeaseExpired):
        store.keepalive(dropped)
    store.revoke(kept)
    assert store.get("/t/lease/kept") is None


def test_watch_survives_a_killed_member(tmp_path):
    with EtcdCluster(tmp_path, members=3) as c:
        store = Etcd(c.endpoints)
        with store.watch("/t/w/", prefix=True) as w:
            store.put("/t/w/a", b"1")
            assert [(t, kv["key"], kv["value"]) for t, kv in w.events(timeout=5)] == [("PUT", b"/t/w/a", b"1")]
            c.kill(0)   # the member the watch (and the client) talked to first
            store.put("/t/w/b", b"2")
            store.delete("/t/w/a")
            seen = []
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                seen += [(t, kv["key"]) for t, kv in w.events(timeout=1)]
            assert seen == [("PUT", b"/t/w/b"), ("DELETE", b"/t/w/a")]


def test_election_hands_over_when_the_leader_s_lease_goes(cluster):
    store = Etcd(cluster.endpoints)
    first, second = store.grant(5), store.grant(5)
    store.campaign("/t/election", b"one", first)
    assert store.leader("/t/election")["value"] == b"one"
    led = threading.Event()
    t = threading.Thread(target=lambda: (store.campaign("/t/election", b"two", second), led.set()), daemon=True)
    t.start()
    assert not led.wait(0.5), "a second candidate led while the first held its lease"
    store.revoke(first)
    assert led.wait(5)
    assert store.leader("/t/election")["value"] == b"two"
    store.revoke(second)
    assert store.leader("/t/election") is None


def test_errors_name_the_members():
    port = free_ports(1)[0]
    with pytest.raises(EtcdError, match=f"no etcd member answers .*127.0.0.1:{port}"):
        Etcd(f"127.0.0.1:{port}", timeout_s=0.5).get("/x")
    for bad in ("localhost", "h:99999", "h:x", ""):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_endpoints(bad)
