"""The execution engine: languages as data, one process runner, confinement; no HTTP here."""
