"""The test suite the pytest plugin runs on a user's implementation (see normcheck.pytest_plugin)."""
