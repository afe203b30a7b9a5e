"""One export, end to end: the stages in order over one export's state (`export`), the
steps around them (`steps`), what a caller hands in (`request`) and the bookkeeping of a
run (`run_state`).
"""
