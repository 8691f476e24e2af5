"""scopebench: where deep-learning solvers spend time, memory and communication.

The library under the three BenchOpt benchmarks of this repository; it never imports
benchopt (see docs/design.md).
"""

__version__ = "0.2.0"
