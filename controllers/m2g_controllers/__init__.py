"""m2g's controllers: thin wiring of watches, caches and reconcilers around the m2g library."""
