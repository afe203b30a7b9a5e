"""Torch's exceptions turned into torchport errors: the one place that classifies them
(`classification`, its `rules`), reading torch's exception text (`exception_text`) and
links to torch's ExportDB (`exportdb`).
"""
