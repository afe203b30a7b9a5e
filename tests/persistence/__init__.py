"""Tests of what the API and the workers share (persistence/): the database and its
migrations, the embedded broker.
"""
