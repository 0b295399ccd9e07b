"""ASGI and FastAPI integration layer for gym_concurrency (installed as gym_concurrency.middleware)."""
