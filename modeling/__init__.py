"""Models: one shared block and its parts, and a thin recipe per architecture."""
