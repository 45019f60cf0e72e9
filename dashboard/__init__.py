"""gpuscope dashboard (Dash + plotly).

Built in a later issue; the package exists now so the repository layout is fixed.
"""
