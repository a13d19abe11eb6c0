"""Side-by-side benchmarks of perdure against plain SQLite (the floor); results are data."""
