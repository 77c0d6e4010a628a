"""tandem ranker."""
