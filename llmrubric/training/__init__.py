"""Training, cross-validation, search and tracking."""
