"""bench/run.py ``--rows``: the plain row and feature rows in one interleaved run, each
feature row's ratio to another server set against the plain row's."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from twisted.trial import unittest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import _common
import run


def flags(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"rows": "", "tls": False, "snappy": False, "deflate": False, "size": 200, **kw})


class RowsTests(unittest.TestCase):
    def test_without_rows_one_row_as_asked(self):
        a = flags(tls=True)
        self.assertEqual(run.rows_of(a), {"": a})

    def test_the_plain_row_first_then_one_per_feature(self):
        rows = run.rows_of(flags(rows="tls,deflate"))
        self.assertEqual(list(rows), ["plain", "tls", "deflate"])
        self.assertEqual(
            [(r.tls, r.snappy, r.deflate) for r in rows.values()],
            [
                (False, False, False),
                (True, False, False),
                (False, False, True),
            ],
        )
        self.assertEqual({r.size for r in rows.values()}, {200})  # the other flags carried over

    def test_an_unknown_feature_or_a_feature_flag_beside_rows_is_refused(self):
        with self.assertRaises(ValueError):
            run.rows_of(flags(rows="tls,gzip"))
        with self.assertRaises(ValueError):
            run.rows_of(flags(rows="tls", snappy=True))

    def test_each_round_set_against_the_plain_row_of_the_same_round(self):
        results = {
            ("plain", "ours", "r"): [200.0, 100.0],
            ("plain", "go", "r"): [100.0, 100.0],
            ("tls", "ours", "r"): [180.0, 90.0],
            ("tls", "go", "r"): [100.0, 90.0],
        }
        # round 1: 1.8 / 2.0; round 2: 1.0 / 1.0
        self.assertEqual([round(v, 6) for v in run.against_plain(results, "tls", "go", "r")], [0.9, 1.0])

    def test_a_row_s_cost_is_the_median_of_each_round_s_difference(self):
        cpu = {
            ("plain", "ours", "r"): [0.8, 0.9, 1.2],
            ("tls", "ours", "r"): [0.9, 1.1, 1.25],
        }
        self.assertAlmostEqual(run.row_cost(cpu, "tls", "ours", "r"), 0.1)


class ProcessSleepsTests(unittest.TestCase):
    """``_common.process_sleeps``: how often a server's threads waited (run.py's waits/1k msgs)."""

    def test_a_thread_that_sleeps_is_counted(self):
        before = _common.process_sleeps(os.getpid())
        time.sleep(0.001)  # what is measured: a nanosleep always gives up the CPU
        self.assertGreater(_common.process_sleeps(os.getpid()), before)

    def test_every_thread_counts(self):
        status = Path(f"/proc/{os.getpid()}/status").read_text()
        own = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        self.assertGreaterEqual(_common.process_sleeps(os.getpid()), own)
