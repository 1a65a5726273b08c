"""Sluice's own HTTP clients: the full-duplex client of the target -> transformer
hop and the receive buffers it reads into."""
