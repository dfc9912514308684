"""Readers of other tools' profile formats."""
