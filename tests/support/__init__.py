"""Test support shared across test folders: a realistic KMock API server and the CR validator."""
