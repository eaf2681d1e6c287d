"""Sub-commands of the ``compaction`` console script (one module each)."""
