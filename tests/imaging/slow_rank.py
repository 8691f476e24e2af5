"""A spawned PnP rank that the tests slow down on purpose (never rank 0).

``SCOPEBENCH_TEST_SLOW_SETUP_SEC``: sleep this long in set-up, before building.
``SCOPEBENCH_TEST_SLOW_DENOISE_SEC``: sleep this long inside every ``denoise`` region.
"""

from __future__ import annotations

import os
import time

from scopebench.imaging.inference.run import PnPRun

TARGET = "imaging.slow_rank:run_worker"


class SlowRun(PnPRun):
    def build(self) -> None:
        time.sleep(float(os.environ.get("SCOPEBENCH_TEST_SLOW_SETUP_SEC", "0")))
        super().build()
        delay = float(os.environ.get("SCOPEBENCH_TEST_SLOW_DENOISE_SEC", "0"))
        if delay:
            denoise = self.engine._denoise

            def slow_denoise(z):
                time.sleep(delay)
                return denoise(z)

            self.engine._denoise = slow_denoise


def run_worker(**kwargs) -> None:
    with SlowRun(**kwargs) as run:
        run.loop(None)
