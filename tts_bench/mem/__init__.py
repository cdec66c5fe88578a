"""Device-memory sampling during a tier: steady state, peak, headroom, A/B and a timeline."""
