import time

import pytest


@pytest.fixture
def utc(monkeypatch):
    """Local time is UTC for the test, so formatted timestamps can be written down."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
