"""gym_concurrency."""
