"""Test support: the one fake engine (fakes), server and live fakes, parity helpers, fixtures' helpers.

Import as ``from support.fakes import ...`` (tests/ is on sys.path through tests/conftest.py)."""
