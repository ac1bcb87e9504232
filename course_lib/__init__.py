"""Companion library for the course."""
