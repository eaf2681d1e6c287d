"""The ``compaction`` console script: one module per sub-command.

Sub-command modules import only the standard library, rich and ``shared``
at module level; what needs an optional extra (a provider SDK, the replay
harness) is imported when the command runs.
"""
