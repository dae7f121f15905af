"""Print the largest status size seen while driving plans of several sizes to the end.

uv run python hack/measure-status-size.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_status_size import largest_status_for

for n in (10, 128, 500):
    size, phase = largest_status_for(n)
    print(f"{n:4d} steps: largest status {size:8d} bytes ({size / 1024:.1f} KiB), ended {phase}")
