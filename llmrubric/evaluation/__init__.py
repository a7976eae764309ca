"""Metrics, calibration measures, significance tests and transfer intervals."""
