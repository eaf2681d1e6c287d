"""Replay of real sessions against a fake provider that enforces the window."""
