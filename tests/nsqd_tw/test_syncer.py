"""Group commit: syncs every --sync-every operations or on tick, one at a time, shared by waiters."""

from __future__ import annotations

import os

from twisted.internet import defer

from nsqd_tw.storage.syncer import Syncer
from tests.nsqd_tw.test_diskqueue import Base, record


class SyncerTests(Base):
    def test_sync_every(self) -> None:
        q = self.queue(sync_every=3)
        q.put_many([record(0), record(1)])
        self.clock.advance(0)
        self.assertEqual(self.syncs, [])
        q.put(record(2))
        self.clock.advance(0)
        self.assertEqual(len(self.syncs), 1)
        self.assertTrue(os.path.exists(q.files.meta_file))

    def test_tick_syncs_what_is_pending(self) -> None:
        q = self.queue()
        q.put(record(0))
        self.syncer.tick()
        self.clock.advance(0)
        self.assertEqual(len(self.syncs), 1)
        self.syncer.tick()
        self.clock.advance(0)
        self.assertEqual(len(self.syncs), 1, "nothing new to sync")

    def test_group_commit(self) -> None:
        started: list[defer.Deferred] = []

        def slow(fn):
            d: defer.Deferred = defer.Deferred()
            started.append(d)
            d.addCallback(lambda _: fn())
            return d

        self.syncer = Syncer(self.clock, slow)
        q = self.queue(sync_every=1)
        q.put(record(0))
        first = [self.syncer.commit(), self.syncer.commit()]
        self.clock.advance(0)
        self.assertEqual(len(started), 1, "one fsync for the commits of one turn")
        q.put(record(1))
        later = [self.syncer.commit() for _ in range(5)]
        self.clock.advance(0)
        self.assertEqual(len(started), 1, "no second sync while one runs")
        started[0].callback(None)
        self.assertTrue(all(d.called for d in first))
        self.assertFalse(any(d.called for d in later))
        self.clock.advance(0)
        self.assertEqual(len(started), 2, "the waiting commits share the next sync")
        started[1].callback(None)
        self.assertTrue(all(d.called for d in later))

    def test_failed_sync_fails_its_commits(self) -> None:
        def broken(fn):
            return defer.fail(OSError(5, "Input/output error"))

        errors = []
        self.syncer = Syncer(self.clock, broken, errors.append)
        self.queue(sync_every=1).put(record(0))
        d = self.syncer.commit()
        self.clock.advance(0)
        f = self.failureResultOf(d, OSError)
        self.assertEqual(f.value.errno, 5)
        self.assertIsInstance(errors[0], OSError)
