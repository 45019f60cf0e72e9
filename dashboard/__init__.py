"""gpuscope dashboard (Dash + plotly). Built in a later issue; the package exists so the layout is fixed."""
