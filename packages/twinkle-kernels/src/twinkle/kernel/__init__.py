"""Ops with a torch reference implementation and registered fast paths."""
