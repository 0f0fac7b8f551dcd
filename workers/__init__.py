"""Everything a worker process does. Core modules here never import Django."""
