"""Tests of the CLI (torchport/): each command run as a user runs it, against a real server
where it talks to one.
"""
