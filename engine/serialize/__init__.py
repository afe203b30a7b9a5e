"""The SERIALIZE stage and what it writes: `program.pt2` (`program_save`), the JSON
documents (`documents`), portable inputs and outputs (`portability`), the artifacts'
names (`artifacts`) and the save → load → run round trip (`roundtrip`). Importable with
torch alone: a loader process imports nothing else.
"""
