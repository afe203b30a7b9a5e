"""The DECOMPOSE stage: `run_decompositions` with the table the options ask for
(`decomposition`) and torch's preservable composite ops (`cia_ops`).
"""
