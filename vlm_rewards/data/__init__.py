"""Episode and pair datasets: the procedural world, on-disk formats, progress-label synthesis."""
