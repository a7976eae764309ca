"""Per-text, per-judge and per-system scores and leaderboards."""
