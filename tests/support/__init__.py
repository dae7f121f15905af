"""What the tests share, in one place: test modules import from here and never from each other
(fixtures live in the conftest.py files).

* :mod:`tests.support.sim`: an in-memory cluster and ledger driving the pure core.
"""
