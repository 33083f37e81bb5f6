"""A user's module that fails while importing (its error must reach the job's message)."""

raise RuntimeError("broken at import")
