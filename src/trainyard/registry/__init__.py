"""Model registry: immutable versions with lineage, aliases with history, the promotion gate."""
