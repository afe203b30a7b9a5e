"""The torchport export engine: load → trace → decompose → verify → serialize.

A pure library: it imports torch and `schemas`, never web, queue or database code,
and never reads the environment.
"""
