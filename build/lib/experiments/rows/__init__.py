"""The one row schema of every result file, and the resumable CSV store that writes it."""
