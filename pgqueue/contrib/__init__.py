"""Integrations with web frameworks; the only part of pgqueue that imports them."""
