"""One benchmark job: load, warm up, decode every item with every decoder interleaved, time, check, and store rows."""
