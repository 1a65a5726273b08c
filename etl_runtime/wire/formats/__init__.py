"""The product's own wire formats: the bulk transform exchange, the tar break
marker, the forward-only shard reader."""
