"""Datasets: ingestion, validation, content-addressed immutable versions, held-out splits, lineage.

Modules: :mod:`.formats` (row formats, validation, canonical form; pure), :mod:`.minhash` (near-duplicate
clusters; pure numpy), :mod:`.ingest` (the streaming three-pass ingestion), :mod:`.tokens` (token
counters), :mod:`.service` (:class:`~trainyard.datasets.service.DatasetService` over the database and
the storage root).

API for other services (the model registry, evaluation, job submission)::

    from trainyard.datasets.service import DatasetService, DatasetVersion

    v: DatasetVersion = platform.datasets.resolve(tenant_id_or_principal, "ds://support@3")
    v.id              # "ds://support@3" ("ds://support" or "@latest" resolve to the newest version)
    v.format          # "text" | "completion" | "chat"
    v.sha256          # content address of the whole version (order- and formatting-independent)
    v.train.url       # fsspec URL of the train split: canonical JSON Lines, one normalised row a line,
    v.eval.url        #   sorted by row hash; rows are {"text"}, {"prompt","completion"} or {"messages"}
    v.eval.rows, v.eval.sha256, v.eval.tokens   # the file's sha256sum, row and token counts
    v.to_document()   # the JSON document of DESIGN §3.7

Another tenant's version raises ``UnknownDatasetError`` (404, code ``unknown_dataset``) exactly as a
missing one does. Read a split with ``fsspec.open(v.eval.url, "rb")`` and ``json.loads`` per line.
"""
