"""The HTML report: sections, rendering and plots."""
