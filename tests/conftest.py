"""Shared pytest configuration.

kind-e2e/ (the local control plane's ``localcp`` and ``prometheus`` tools) and bench/ (the twin
keeps its modules in bench/twinkit: a bench, not a package) are on the import path through
``pythonpath`` in pyproject.toml's [tool.pytest.ini_options], not through sys.path edits.
"""
