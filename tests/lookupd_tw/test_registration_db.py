from twisted.trial import unittest

from lookupd_tw.registration_db import PeerInfo, Producer, Registration, RegistrationDB, filter_by_active


def producer(peer_id: str, last_update: float = 100.0) -> Producer:
    return Producer(
        PeerInfo(id=peer_id, broadcast_address="h", tcp_port=1, http_port=2, version="1.3.0", last_update=last_update)
    )


class RegistrationDBTests(unittest.TestCase):
    def test_add_and_remove_producers(self) -> None:
        db = RegistrationDB()
        k = Registration("topic", "t", "")
        self.assertTrue(db.add_producer(k, producer("a")))
        self.assertFalse(db.add_producer(k, producer("a")))
        self.assertTrue(db.add_producer(k, producer("b")))
        self.assertEqual(db.remove_producer(k, "a"), (True, 1))
        self.assertEqual(db.remove_producer(k, "a"), (False, 1))
        self.assertEqual(db.remove_producer(k, "b"), (True, 0))
        self.assertEqual(db.find_registrations("topic", "t", ""), [k], "the key stays, as in Go")
        self.assertEqual(db.remove_producer(Registration("topic", "x", ""), "a"), (False, 0))

    def test_wildcards(self) -> None:
        db = RegistrationDB()
        db.add_producer(Registration("channel", "t", "c1"), producer("a"))
        db.add_producer(Registration("channel", "t", "c2"), producer("a"))
        db.add_producer(Registration("channel", "u", "c1"), producer("b"))
        self.assertEqual([r.subkey for r in db.find_registrations("channel", "t", "*")], ["c1", "c2"])
        self.assertEqual(len(db.find_registrations("channel", "*", "c1")), 2)
        self.assertEqual([p.peer_info.id for p in db.find_producers("channel", "*", "*")], ["a", "b"])
        self.assertEqual(
            db.lookup_registrations("a"), [Registration("channel", "t", "c1"), Registration("channel", "t", "c2")]
        )

    def test_filter_by_active(self) -> None:
        fresh, stale, buried = producer("a", 100.0), producer("b", 10.0), producer("c", 100.0)
        buried.tombstone(now=95.0)
        self.assertEqual(filter_by_active([fresh, stale, buried], 30.0, 45.0, now=105.0), [fresh])
        self.assertEqual(filter_by_active([buried], 60.0, 45.0, now=141.0), [buried], "the tombstone expired")

    def test_retired_peer(self) -> None:
        db = RegistrationDB()
        t, c = Registration("topic", "t", ""), Registration("channel", "t", "c")
        a, b = producer("a"), producer("b")
        for p in (a, b):
            db.add_producer(t, p)
            db.add_producer(c, p)
        self.assertEqual(db.retire(a.peer_info), [t, c])
        self.assertEqual([p.peer_info.id for p in db.find_producers("topic", "t", "")], ["b"], "hidden at once")
        self.assertEqual([p.peer_info.id for p in db.find_producers("topic", "*", "")], ["b"])
        self.assertEqual(db.lookup_registrations("a"), [])
        self.assertEqual(db.remove_producer(c, "b"), (True, 0), "a retired peer is not counted")
        self.assertEqual(db.remove_producer(t, "a"), (False, 1), "nor removed as if connected")
        # the same ID connects again: its entries replace the retired ones
        again = producer("a")
        self.assertTrue(db.add_producer(t, again))
        self.assertFalse(db.remove_retired(t, a.peer_info), "not the retired peer's entry any more")
        self.assertTrue(db.remove_retired(c, a.peer_info))
        self.assertFalse(db.remove_retired(c, a.peer_info))
        self.assertEqual(db.registrations, {t: {"b": b, "a": again}, c: {}})
        self.assertEqual(db.lookup_registrations("a"), [t])
