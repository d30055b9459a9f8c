"""The SemanticKV study: semantic-type-aware eviction (``static_semantic``,
``adaptive_semantic``) against the classic policies on the suite of stress workloads in
``experiments/semantickv/``, in the serving simulator; notebooks in ``notebooks/semantickv/``.

``suite`` runs the configs together, ``figures`` draws the suite-wide comparison, ``theses``
turns the seed's claims (adaptive vs LRU and vs the best other online policy) into paired
intervals over seeds.
"""
