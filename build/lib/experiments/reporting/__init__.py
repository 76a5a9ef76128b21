"""Tables and plots from result rows: speedup, compression, quality, leaderboards, and the views of a suite's, a tool's or several jobs' result folders."""
