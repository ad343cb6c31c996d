"""`PYTHONPATH=src python -m draftline.planning.sizing` prints docs/sizing.md's tables (tests/test_docs.py
checks the page holds them)."""

from pathlib import Path

from draftline.planning.sizing.tables import docs_tables

if __name__ == "__main__":
    print(docs_tables(Path(__file__).resolve().parents[4]))
