#!/usr/bin/env python3
"""Checks of scripts/junit.py (make test's static group runs them): cases recorded
twice, long names, totals."""

import os
import subprocess
import sys
import tempfile
import unittest

JUNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "junit.py")


def junit(*args, timeout=20):
    return subprocess.run([sys.executable, JUNIT, *args], capture_output=True, text=True, timeout=timeout)


class Cases(unittest.TestCase):
    def test_a_long_name_failed_twice_is_two_failed_cases(self):
        # A name of more than 100 characters, recorded twice, as a check that fails the
        # same way twice does: two cases (the second once looped for ever).
        name = "resume-torch prints what the document shows (missing: " + "rank 0: weights = 1.1 " * 8 + ")"
        with tempfile.TemporaryDirectory() as d:
            for _ in range(2):
                self.assertEqual(junit("case", d, name, "log: somewhere").returncode, 0)
            self.assertEqual(len(os.listdir(d)), 2)
            total = junit("total", d)
            self.assertEqual(total.stdout.strip(), "0 passed, 2 failed")

    def test_a_short_name_recorded_thrice_is_three_cases(self):
        with tempfile.TemporaryDirectory() as d:
            for _ in range(3):
                junit("case", d, "fmt")
            self.assertEqual(sorted(os.listdir(d)), ["fmt-2.xml", "fmt-3.xml", "fmt.xml"])
            self.assertEqual(junit("total", d).stdout.strip(), "3 passed, 0 failed")


if __name__ == "__main__":
    unittest.main()
