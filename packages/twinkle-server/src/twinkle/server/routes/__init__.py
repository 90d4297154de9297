"""HTTP routes, one module per resource; each takes the ServerState from the app."""
