"""Every test under tests/integration is marked ``integration``.

The fixtures (``cluster``, ``kube``, ``kubectl``, ``namespace``, ``crd_installed``) live in
``tests/conftest.py``, shared with tests/e2e: one session cluster for both suites.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)
