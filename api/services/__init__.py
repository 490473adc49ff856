"""Writes. Every change of state goes through a function in this package."""
