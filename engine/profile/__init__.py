"""Profiles of a job's artifacts (`profiling`) and the process's resident memory
(`resident_memory`).
"""
