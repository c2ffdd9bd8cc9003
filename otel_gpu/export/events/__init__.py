"""GPU events: state changes read off consecutive snapshots, handed to whoever sends them."""
