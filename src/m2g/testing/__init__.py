"""Test and benchmark support that ships with the library (synthetic factories, traces)."""
