"""Periodic jobs and their once-per-period claims."""
