"""Running a plan: the Ray cluster, the sweep run (a state machine over trial
groups), the live progress view and the results store.
"""
