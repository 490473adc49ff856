"""Reads. Views, consumers and the admin fetch data through these functions."""
