"""The vocabulary of numbers and layouts: dtypes and unit roundoff, memory-format names, value
profiles, normalisation sets. NumPy and the standard library only: no framework."""
