"""The summarizer: prompts, LLM providers, the offline extractive fallback and quality checks.

A worker turns the oldest un-summarized messages of a session into a
structured summary (Goal, Constraints, Progress, Key decisions, Next steps,
Critical context, Read files, Modified files), merging into the previous
summary rather than starting over, and never stores a reply that fails the
quality check.
"""
