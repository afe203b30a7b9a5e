"""The environment an export ran in: versions and machine (`machine`) and the third-party
libraries installed and loaded (`libraries`).
"""
