"""tandem experiments."""
