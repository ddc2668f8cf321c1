"""The result backend: results and failures read from and written to the job rows
themselves, compare-and-swapped on the claim while one is held."""
