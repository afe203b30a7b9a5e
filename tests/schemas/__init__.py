"""Tests of the contract package (schemas/)."""
