"""tandem runtime."""
