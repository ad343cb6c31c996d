"""Write config/schema/config.schema.yaml from the settings models:
`PYTHONPATH=src python -m draftline.settings.export` (tests/test_settings.py holds the file equal)."""

from draftline.settings.schema import SCHEMA, schema_text

if __name__ == "__main__":
    SCHEMA.write_text(schema_text())
