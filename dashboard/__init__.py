"""gpuscope dashboard (Dash + plotly): fleet view, starvation and stragglers, idle cost."""
