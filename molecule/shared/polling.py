"""Waiting in the Molecule tests: poll a condition until it holds, riding out services that are (re)starting."""
import time

# What a check raises while the thing it asks is not there yet: a port that is not listening (the request in the
# container fails, so check_output raises AssertionError), a connection reset, a half-written answer.
NOT_YET = (AssertionError, OSError, ValueError)


def wait_for(what, check, timeout, interval=1.0):
    """Call check() until it returns something truthy and return that.

    A check that raises one of NOT_YET counts as "not yet". After `timeout` seconds the wait fails with `what`
    and the last value or error, so a failure says what was seen last.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = check()
        except NOT_YET as error:  # the service may still be starting; the error is reported if it never is
            last = "%s: %s" % (type(error).__name__, str(error)[:500])
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %ss waiting for %s (last: %r)" % (timeout, what, last))
        time.sleep(interval)
