from twisted.trial import unittest

from nsqd_tw.core.message import Message
from nsqd_tw.core.pqueue import TimeoutQueue


def msg(i: int) -> Message:
    return Message(b"%016x" % i, b"", 0)


class TimeoutQueueTests(unittest.TestCase):
    def test_pop_due_in_order(self) -> None:
        q = TimeoutQueue()
        for i, due in enumerate([5.0, 1.0, 3.0, 2.0]):
            q.push(msg(i), due)
        self.assertEqual([m.pri for m in q.pop_due(3.0)], [1.0, 2.0, 3.0])
        self.assertEqual(len(q), 1)
        self.assertEqual(q.next_due(), 5.0)

    def test_removed_messages_do_not_come_back(self) -> None:
        q = TimeoutQueue()
        a, b = msg(1), msg(2)
        q.push(a, 1.0)
        q.push(b, 2.0)
        self.assertIs(q.remove(a.id), a)
        self.assertIsNone(q.remove(a.id))
        self.assertEqual(list(q.pop_due(10.0)), [b])

    def test_repush_moves_the_deadline(self) -> None:
        q = TimeoutQueue()
        a = msg(1)
        q.push(a, 1.0)
        q.remove(a.id)
        q.push(a, 5.0)
        self.assertEqual(list(q.pop_due(2.0)), [])
        self.assertEqual(list(q.pop_due(5.0)), [a])

    def test_push_many_is_push_of_each(self) -> None:
        q = TimeoutQueue()
        burst = [msg(i) for i in range(3)]
        q.push_many(burst, 2.0)
        q.push(msg(9), 1.0)
        self.assertEqual([m.pri for m in burst], [2.0, 2.0, 2.0])
        self.assertIs(q.remove(burst[1].id), burst[1])
        self.assertEqual([m.id for m in q.pop_due(2.0)], [msg(9).id, burst[0].id, burst[2].id])
        self.assertEqual(len(q), 0)

    def test_take_owned(self) -> None:
        q = TimeoutQueue()
        mine, theirs = msg(1), msg(2)
        mine.client_id, theirs.client_id = 7, 8
        q.push_many([mine, theirs], 1.0)
        taken, refused = q.take_owned(7, [mine.id, theirs.id, b"0123456789abcdef", mine.id])
        self.assertEqual(taken, [mine])
        self.assertEqual(
            refused,
            [
                (theirs.id, "client does not own message"),
                (b"0123456789abcdef", "ID not in flight"),
                (mine.id, "ID not in flight"),
            ],
        )
        self.assertIsNone(mine.bucket)
        self.assertEqual(list(q.pop_due(1.0)), [theirs])  # the refused one stayed as it was

    def test_removed_messages_leave_nothing_behind(self) -> None:
        q = TimeoutQueue()
        keep = [msg(i) for i in range(10)]
        for i, m in enumerate(keep):
            q.push(m, float(i))
        for i in range(10, 50000):
            m = msg(i)
            q.push(m, 1000.0 + i / 1000)
            q.remove(m.id)
        self.assertEqual(sum(len(b) for b in q._buckets.values()), 10)
        self.assertEqual(list(q.pop_due(100.0)), keep)

    def test_never_released_early(self) -> None:
        q = TimeoutQueue(resolution=0.1)
        a, b = msg(1), msg(2)
        q.push(a, 10.03)
        q.push(b, 10.07)
        self.assertEqual(list(q.pop_due(10.05)), [a])
        self.assertEqual(list(q.pop_due(10.069)), [])
        self.assertEqual(list(q.pop_due(10.07)), [b])
        self.assertEqual((len(q), q._keys), (0, []))

    def test_clear(self) -> None:
        q = TimeoutQueue()
        q.push(msg(1), 1.0)
        self.assertEqual(len(q.clear()), 1)
        self.assertEqual(list(q.pop_due(2.0)), [])
        self.assertIsNone(q.next_due())

    def test_no_reference_cycle_outlives_the_queueing(self) -> None:
        """A queued message points at its bucket (a dict that holds it); each way
        out of the queue drops that, so the collector has nothing to find."""
        import gc

        q = TimeoutQueue()
        removed, due, cleared = msg(1), msg(2), msg(3)
        for m, at in ((removed, 1.0), (due, 1.0), (cleared, 2.0)):
            q.push(m, at)
        q.remove(removed.id)
        self.assertEqual(list(q.pop_due(1.5)), [due])  # a bucket released whole
        self.assertEqual(q.clear(), [cleared])
        gc.collect()
        gc.disable()
        self.addCleanup(gc.enable)
        del q, removed, due, cleared, m
        self.assertEqual(gc.collect(), 0)

    def test_a_due_time_pushed_again_after_its_bucket_went(self) -> None:
        q = TimeoutQueue()
        a, b, c = msg(1), msg(2), msg(3)
        q.push(a, 1.0)
        self.assertEqual(list(q.pop_due(1.5)), [a])
        q.push(b, 1.0)  # the same due time: its old bucket was released
        self.assertEqual(list(q.pop_due(1.5)), [b])
        q.push(c, 1.0)
        q.clear()
        q.push(c, 1.0)
        self.assertEqual(list(q.pop_due(1.5)), [c])

    def test_a_bucket_emptied_before_its_time_keeps_no_table(self) -> None:
        """A burst's bucket stays until its due time (the message timeout) even when its
        messages were all finished long before: it does not keep the table it grew to."""
        import sys

        q = TimeoutQueue()
        finished, requeued = [msg(i) for i in range(2500)], [msg(i) for i in range(2500, 5000)]
        for m in finished:
            m.client_id = 7
        q.push_many(finished, 60.0)  # FINed (take_owned)
        q.push_many(requeued, 60.1)  # REQ, TOUCH, a consumer gone (remove)
        buckets = [finished[0].bucket, requeued[0].bucket]
        self.assertGreater(min(map(sys.getsizeof, buckets)), 50_000)
        q.take_owned(7, [m.id for m in finished])
        for m in requeued:
            q.remove(m.id)
        self.assertEqual(list(map(sys.getsizeof, buckets)), [sys.getsizeof({})] * 2)
        late = msg(9999)
        q.push(late, 60.0)  # the same due time: the same bucket, used again
        self.assertEqual(list(q.pop_due(61.0)), [late])
