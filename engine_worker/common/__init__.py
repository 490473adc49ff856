"""What every part of the engine shares: the request types (:mod:`.request`), the configuration
(:mod:`.config`) and the typed errors (:mod:`.errors`). Plain Python: importing them loads no mlx."""
