"""Core: errors, registries, seeded RNG streams, payloads and atomic serialisation."""
