"""Eclectus server: sessions, graphs, scheduling and the built-in engine."""
