"""Every decoder a job compares, behind one interface: the core's greedy, lookahead and auto, and transformers' own."""
