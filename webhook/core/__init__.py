"""The ground floor: types every package shares (findings, modes, source objects).

Imports nothing of draguard.
"""
