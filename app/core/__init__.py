"""The document's Qt-free core: where models come from (`opening`), checkpoint load and export
(`checkpoints`), the replayable edits (`edits`) and the project file's typed schema and reading
(`schema`, `project`). Nothing here imports Qt or `widgets`: the window's controllers run it
and show its errors (an import-linter contract in pyproject.toml keeps it so)."""
