"""One-off measurements behind numbers in docs/ (``python -m tools.experiments.NAME`` from the repository
root; docs/tools.md lists them). Not installed: they may import relaxc and its benchmarks, nothing imports them
but the tests."""
