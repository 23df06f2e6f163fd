from twisted.trial import unittest

from nsqd_tw.core.guid import GUIDFactory


class GUIDTests(unittest.TestCase):
    def test_format(self) -> None:
        f = GUIDFactory(5, lambda: 1_700_000_000_000_000_000)
        i = f.new_id()
        self.assertEqual(len(i), 16)
        int(i, 16)
        self.assertEqual((int(i, 16) >> 12) & 0x3FF, 5)

    def test_same_layout_as_go(self) -> None:
        now = 1_700_000_000_000_000_000
        f = GUIDFactory(1023, lambda: now)
        expected = (((now >> 20) - 1288834974288) << 22) | (1023 << 12) | 0
        self.assertEqual(f.new_id(), b"%016x" % expected)

    def test_unique_and_increasing_with_a_stuck_clock(self) -> None:
        f = GUIDFactory(7, lambda: 1_700_000_000_000_000_000)
        ids = [f.new_id() for _ in range(5000)] + f.new_ids(10000) + [f.new_id()]
        self.assertEqual(len(set(ids)), len(ids))
        self.assertEqual(ids, sorted(ids))

    def test_clock_going_backwards(self) -> None:
        times = iter([2_000_000_000_000_000_000, 1_000_000_000_000_000_000, 1_000_000_000_000_000_000])
        f = GUIDFactory(0, lambda: next(times))
        ids = [f.new_id(), f.new_id(), f.new_id()]
        self.assertEqual(ids, sorted(set(ids)))

    def test_node_id_range(self) -> None:
        self.assertRaises(ValueError, GUIDFactory, 1024, lambda: 0)
        self.assertRaises(ValueError, GUIDFactory, -1, lambda: 0)

    def test_a_batch_is_the_ids_one_by_one_would_be(self) -> None:
        now = 1_700_000_000_000_000_000
        one, batch = GUIDFactory(1023, lambda: now), GUIDFactory(1023, lambda: now)
        one_by_one = [one.new_id() for _ in range(9000)]  # past two sequence wraps
        self.assertEqual(batch.new_ids(100) + batch.new_ids(8900), one_by_one)
        tick = ((now >> 20) - 1288834974288) << 22 | 1023 << 12
        self.assertEqual(one_by_one[:2], [b"%016x" % tick, b"%016x" % (tick | 1)])

    def test_runs_are_the_ids_a_batch_would_be(self) -> None:
        """new_id_runs hands the IDs as (prefix, suffixes): a run per clock tick
        the batch spans, the same IDs new_ids makes."""
        now = 1_700_000_000_000_000_000
        runs_f, ids_f = GUIDFactory(9, lambda: now), GUIDFactory(9, lambda: now)
        for n in (1, 4095, 4097, 9000, 3):  # sequence wraps inside and at the edge of a batch
            runs = runs_f.new_id_runs(n)
            self.assertEqual([p + s for p, suffixes in runs for s in suffixes], ids_f.new_ids(n))
            self.assertTrue(all(len(p) == 13 and all(len(s) == 3 for s in ss) for p, ss in runs))
        self.assertEqual(runs_f.new_id_runs(0), [])
