"""Experiments by name: each module here registers its named configs."""
