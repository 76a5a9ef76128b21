"""Tables and plots from result rows: speedup, compression, quality, leaderboards, and the views the presets print."""
