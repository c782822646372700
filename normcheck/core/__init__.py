"""The bottom layer: the error types, one-line exception text, and loading `module:attr` specs.

Standard library only; every other layer may import it.
"""
