"""The Molecule tests' wait helper (molecule/shared/polling.py)."""
import pytest

from polling import wait_for


def test_returns_the_first_true_value():
    values = iter([None, [], {"up": 1}])
    assert wait_for("a value", lambda: next(values), timeout=5, interval=0) == {"up": 1}


def test_a_service_still_starting_is_not_yet_a_failure():
    calls = []

    def check():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("connection refused")
        return "ready"
    assert wait_for("ready", check, timeout=5, interval=0) == "ready"
    assert len(calls) == 3


def test_timeout_names_what_and_the_last_error():
    def check():
        raise AssertionError("HTTP 503 from vmalert")
    with pytest.raises(AssertionError, match=r"waiting for vmalert ready \(last: 'AssertionError: HTTP 503"):
        wait_for("vmalert ready", check, timeout=0.2, interval=0.05)


def test_timeout_shows_the_last_value():
    with pytest.raises(AssertionError, match=r"waiting for two peers \(last: \[\]\)"):
        wait_for("two peers", lambda: [], timeout=0.1, interval=0.05)


def test_a_programming_error_is_not_hidden():
    with pytest.raises(KeyError):
        wait_for("a key", lambda: {}["missing"], timeout=5, interval=0)
