"""Data sets: fetch, read and simulate."""
