"""Planning: the sweep file's model, model resolution, grid expansion into trials,
and what the cluster can run (capabilities). Imports ``sweeper.core`` only.
"""
