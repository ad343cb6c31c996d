"""Helpers for tests: tiny local models and data, no downloads."""
