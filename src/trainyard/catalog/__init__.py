"""Accelerators, instance offers and prices, software stacks; packaged CSV data (see data/SOURCES.md)."""
