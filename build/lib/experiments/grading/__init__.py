"""Grading generated text: ROUGE and pass@k metrics, the bubblewrap sandbox that runs generated code, and the agreement check against the benchmarks' own graders."""
