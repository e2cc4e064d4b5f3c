"""One adapter module per peer queue system; each imports its library lazily."""
